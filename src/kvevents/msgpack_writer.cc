#include "kvevents/msgpack_writer.h"

#include <cstring>

namespace metrale::kvevents {

void MsgpackWriter::be(uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
}

void MsgpackWriter::array(size_t n) {
  if (n < 16) {
    out_ += static_cast<char>(0x90 | n);
  } else if (n <= 0xffff) {
    out_ += static_cast<char>(0xdc);
    be(n, 2);
  } else {
    out_ += static_cast<char>(0xdd);
    be(n, 4);
  }
}

void MsgpackWriter::map(size_t n) {
  if (n < 16) {
    out_ += static_cast<char>(0x80 | n);
  } else if (n <= 0xffff) {
    out_ += static_cast<char>(0xde);
    be(n, 2);
  } else {
    out_ += static_cast<char>(0xdf);
    be(n, 4);
  }
}

void MsgpackWriter::nil() { out_ += static_cast<char>(0xc0); }

void MsgpackWriter::boolean(bool v) { out_ += static_cast<char>(v ? 0xc3 : 0xc2); }

void MsgpackWriter::unsigned_integer(uint64_t v) {
  if (v < 128) {
    out_ += static_cast<char>(v);
  } else if (v <= 0xff) {
    out_ += static_cast<char>(0xcc);
    be(v, 1);
  } else if (v <= 0xffff) {
    out_ += static_cast<char>(0xcd);
    be(v, 2);
  } else if (v <= 0xffffffffull) {
    out_ += static_cast<char>(0xce);
    be(v, 4);
  } else {
    out_ += static_cast<char>(0xcf);
    be(v, 8);
  }
}

void MsgpackWriter::integer(int64_t v) {
  if (v >= 0) return unsigned_integer(static_cast<uint64_t>(v));
  if (v >= -32) {
    out_ += static_cast<char>(static_cast<uint8_t>(v));  // negative fixint 111xxxxx
  } else if (v >= INT8_MIN) {
    out_ += static_cast<char>(0xd0);
    be(static_cast<uint64_t>(v), 1);
  } else if (v >= INT16_MIN) {
    out_ += static_cast<char>(0xd1);
    be(static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN) {
    out_ += static_cast<char>(0xd2);
    be(static_cast<uint64_t>(v), 4);
  } else {
    out_ += static_cast<char>(0xd3);
    be(static_cast<uint64_t>(v), 8);
  }
}

void MsgpackWriter::float64(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  out_ += static_cast<char>(0xcb);
  be(bits, 8);
}

void MsgpackWriter::str(std::string_view s) {
  const size_t n = s.size();
  if (n < 32) {
    out_ += static_cast<char>(0xa0 | n);
  } else if (n <= 0xff) {
    out_ += static_cast<char>(0xd9);
    be(n, 1);
  } else if (n <= 0xffff) {
    out_ += static_cast<char>(0xda);
    be(n, 2);
  } else {
    out_ += static_cast<char>(0xdb);
    be(n, 4);
  }
  out_.append(s);
}

}  // namespace metrale::kvevents
