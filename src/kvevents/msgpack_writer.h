#pragma once
// The few MessagePack types the KV-event wire format needs (arrays, maps, integers, nil, strings,
// float64), written big-endian as the spec (github.com/msgpack/msgpack/blob/master/spec.md)
// has them, always in the smallest form. A writer, not a library: nothing here is read back.
#include <cstdint>
#include <string>
#include <string_view>

namespace metrale::kvevents {

class MsgpackWriter {
 public:
  void array(size_t n);
  void map(size_t n);  // n key-value pairs follow
  void nil();
  void boolean(bool v);
  void integer(int64_t v);
  void unsigned_integer(uint64_t v);
  void float64(double v);
  void str(std::string_view s);
  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void be(uint64_t v, int n);  // the low n bytes of v, most significant first
  std::string out_;
};

}  // namespace metrale::kvevents
