// Every 8- and 16-bit code decoded, and ~28k f32 values encoded, against bit patterns that
// torch recorded (tools/fixtures/dtype/make_dtype_golden.py documents the file and oracle).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace metrale {
namespace {

static_assert(std::endian::native == std::endian::little, "the golden file is little endian");

constexpr char kPath[] = "tests/data/core/dtype_golden.bin";
constexpr size_t kHeader = 16;
constexpr size_t kDecode16 = 65536 * 8;
constexpr size_t kDecode8 = 256 * 12;
constexpr size_t kDecode4 = 16 * 4;
constexpr size_t kEncodeRecord = 12;

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

template <typename T>
T read(const std::vector<unsigned char>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

std::string hex(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// Collects mismatches and reports the count plus the first few, instead of one failure per
// code of a 65536-entry sweep.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  void check(uint32_t input, uint32_t want, uint32_t got) {
    ++checked_;
    if (want == got) return;
    if (count_++ < 8)
      first_ += "\n  input " + hex(input) + ": want " + hex(want) + ", got " + hex(got);
  }
  ~Mismatches() {
    EXPECT_GT(checked_, 0u) << what_;
    EXPECT_EQ(count_, 0u) << what_ << ": " << count_ << " of " << checked_ << " differ" << first_;
  }

 private:
  std::string what_;
  std::string first_;
  size_t count_ = 0;
  size_t checked_ = 0;
};

class DTypeGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream f(kPath, std::ios::binary);
    ASSERT_TRUE(f) << "cannot open " << kPath << " (tests run from the source root)";
    bytes_.assign(std::istreambuf_iterator<char>(f), {});
    ASSERT_GE(bytes_.size(), kHeader);
    ASSERT_EQ(std::string(reinterpret_cast<const char*>(bytes_.data()), 8), "MTDTYPE1");
    n_enc_ = read<uint32_t>(bytes_, 8);
    ASSERT_EQ(bytes_.size(), kHeader + kDecode16 + kDecode8 + kDecode4 + n_enc_ * kEncodeRecord);
    ASSERT_GT(n_enc_, 10000u);
  }
  static size_t decode8_at(size_t c) { return kHeader + kDecode16 + c * 12; }
  static size_t encode_at(size_t i) {
    return kHeader + kDecode16 + kDecode8 + kDecode4 + i * kEncodeRecord;
  }

  static std::vector<unsigned char> bytes_;
  static size_t n_enc_;
};
std::vector<unsigned char> DTypeGolden::bytes_;
size_t DTypeGolden::n_enc_ = 0;

TEST_F(DTypeGolden, Decode16AllCodes) {
  Mismatches f16("f16 -> f32"), bf16("bf16 -> f32");
  for (uint32_t c = 0; c < 65536; ++c) {
    const size_t off = kHeader + c * 8;
    f16.check(c, read<uint32_t>(bytes_, off), bits(f16_to_f32(static_cast<uint16_t>(c))));
    bf16.check(c, read<uint32_t>(bytes_, off + 4), bits(bf16_to_f32(static_cast<uint16_t>(c))));
  }
}

TEST_F(DTypeGolden, Decode8AllCodes) {
  Mismatches e4m3("e4m3 -> f32"), e5m2("e5m2 -> f32"), e8m0("e8m0 -> f32");
  for (uint32_t c = 0; c < 256; ++c) {
    const auto b = static_cast<uint8_t>(c);
    e4m3.check(c, read<uint32_t>(bytes_, decode8_at(c)), bits(f8e4m3_to_f32(b)));
    e5m2.check(c, read<uint32_t>(bytes_, decode8_at(c) + 4), bits(f8e5m2_to_f32(b)));
    e8m0.check(c, read<uint32_t>(bytes_, decode8_at(c) + 8), bits(e8m0_to_f32(b)));
  }
}

TEST_F(DTypeGolden, Decode4AllCodes) {
  Mismatches e2m1("e2m1 -> f32");
  for (uint32_t c = 0; c < 16; ++c) {
    const size_t off = kHeader + kDecode16 + kDecode8 + c * 4;
    e2m1.check(c, read<uint32_t>(bytes_, off), bits(e2m1_to_f32(static_cast<uint8_t>(c))));
    // Only the low nibble counts.
    e2m1.check(c | 0xF0, read<uint32_t>(bytes_, off),
               bits(e2m1_to_f32(static_cast<uint8_t>(c | 0xF0))));
  }
}

TEST_F(DTypeGolden, EncodeFromF32) {
  Mismatches bf16("f32 -> bf16"), f16("f32 -> f16"), e4m3("f32 -> e4m3"), e5m2("f32 -> e5m2"),
      e8m0("f32 -> e8m0"), e2m1("f32 -> e2m1");
  for (size_t i = 0; i < n_enc_; ++i) {
    const size_t off = encode_at(i);
    const uint32_t in = read<uint32_t>(bytes_, off);
    const float x = std::bit_cast<float>(in);
    bf16.check(in, read<uint16_t>(bytes_, off + 4), f32_to_bf16(x));
    f16.check(in, read<uint16_t>(bytes_, off + 6), f32_to_f16(x));
    e4m3.check(in, bytes_[off + 8], f32_to_f8e4m3(x));
    e5m2.check(in, bytes_[off + 9], f32_to_f8e5m2(x));
    e8m0.check(in, bytes_[off + 10], f32_to_e8m0(x));
    e2m1.check(in, bytes_[off + 11], f32_to_e2m1(x));
  }
}

// The bulk helpers over the same golden inputs: byte-identical to the scalar conversions,
// e2m1 packed low nibble first.
TEST_F(DTypeGolden, BulkFromF32MatchesGolden) {
  std::vector<float> x(n_enc_);
  for (size_t i = 0; i < n_enc_; ++i)
    x[i] = std::bit_cast<float>(read<uint32_t>(bytes_, encode_at(i)));
  std::vector<uint16_t> b16(n_enc_), h16(n_enc_);
  std::vector<uint8_t> e4(n_enc_), e5(n_enc_), e8(n_enc_), e2((n_enc_ + 1) / 2);
  from_f32(x.data(), DType::kBF16, b16.data(), n_enc_);
  from_f32(x.data(), DType::kF16, h16.data(), n_enc_);
  from_f32(x.data(), DType::kF8E4M3, e4.data(), n_enc_);
  from_f32(x.data(), DType::kF8E5M2, e5.data(), n_enc_);
  from_f32(x.data(), DType::kE8M0, e8.data(), n_enc_);
  from_f32(x.data(), DType::kE2M1, e2.data(), n_enc_);
  Mismatches m("bulk from_f32");
  for (size_t i = 0; i < n_enc_; ++i) {
    const size_t off = encode_at(i);
    const uint32_t in = bits(x[i]);
    m.check(in, read<uint16_t>(bytes_, off + 4), b16[i]);
    m.check(in, read<uint16_t>(bytes_, off + 6), h16[i]);
    m.check(in, bytes_[off + 8], e4[i]);
    m.check(in, bytes_[off + 9], e5[i]);
    m.check(in, bytes_[off + 10], e8[i]);
    m.check(in, bytes_[off + 11], (e2[i / 2] >> ((i % 2) * 4)) & 0xF);
  }
}

TEST_F(DTypeGolden, BulkToF32MatchesGoldenDecode) {
  std::vector<uint16_t> codes16(65536);
  for (uint32_t c = 0; c < 65536; ++c) codes16[c] = static_cast<uint16_t>(c);
  std::vector<float> out(65536);
  Mismatches m("bulk to_f32");
  to_f32(codes16.data(), DType::kF16, out.data(), out.size());
  for (uint32_t c = 0; c < 65536; ++c)
    m.check(c, read<uint32_t>(bytes_, kHeader + c * 8), bits(out[c]));
  to_f32(codes16.data(), DType::kBF16, out.data(), out.size());
  for (uint32_t c = 0; c < 65536; ++c)
    m.check(c, read<uint32_t>(bytes_, kHeader + c * 8 + 4), bits(out[c]));
  std::vector<uint8_t> codes8(256);
  for (uint32_t c = 0; c < 256; ++c) codes8[c] = static_cast<uint8_t>(c);
  const DType types8[] = {DType::kF8E4M3, DType::kF8E5M2, DType::kE8M0};
  for (size_t k = 0; k < 3; ++k) {
    to_f32(codes8.data(), types8[k], out.data(), 256);
    for (uint32_t c = 0; c < 256; ++c)
      m.check(c, read<uint32_t>(bytes_, decode8_at(c) + 4 * k), bits(out[c]));
  }
  // 256 bytes hold 512 packed e2m1 values: element 2i is byte i's low nibble.
  to_f32(codes8.data(), DType::kE2M1, out.data(), 512);
  for (uint32_t i = 0; i < 512; ++i) {
    const uint32_t nibble = (codes8[i / 2] >> ((i % 2) * 4)) & 0xF;
    m.check(i, read<uint32_t>(bytes_, kHeader + kDecode16 + kDecode8 + nibble * 4), bits(out[i]));
  }
}

}  // namespace
}  // namespace metrale
