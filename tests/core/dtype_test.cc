// DType tables, sizes and the bulk helpers' non-float paths; the conversions themselves are
// checked bit for bit against torch in dtype_golden_test.cc.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace metrale {
namespace {

constexpr DType kAll[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kF8E4M3, DType::kF8E5M2,
                          DType::kE2M1, DType::kE8M0, DType::kI8,   DType::kU8,     DType::kI32,
                          DType::kI64,  DType::kBool, DType::kI16,  DType::kF64};

TEST(DType, SafetensorsNamesRoundTrip) {
  for (DType t : kAll) {
    const auto back = dtype_from_safetensors(dtype_safetensors_name(t));
    ASSERT_TRUE(back.has_value()) << dtype_name(t);
    EXPECT_EQ(*back, t);
  }
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(dtype_from_safetensors("F4"), DType::kE2M1);
  EXPECT_FALSE(dtype_from_safetensors("bf16").has_value());  // the header spelling is upper case
  EXPECT_FALSE(dtype_from_safetensors("").has_value());
  EXPECT_FALSE(dtype_from_safetensors("C64").has_value());
}

TEST(DType, NamesAreDistinct) {
  for (DType a : kAll) {
    for (DType b : kAll) {
      if (a != b) {
        EXPECT_NE(dtype_name(a), dtype_name(b));
      }
    }
  }
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "f8_e4m3");
}

TEST(DType, BitsAndBytes) {
  EXPECT_EQ(dtype_bits(DType::kF32), 32);
  EXPECT_EQ(dtype_bits(DType::kBF16), 16);
  EXPECT_EQ(dtype_bits(DType::kE2M1), 4);
  EXPECT_EQ(dtype_bits(DType::kE8M0), 8);
  EXPECT_EQ(dtype_bits(DType::kI64), 64);
  for (DType t : kAll) {
    EXPECT_EQ(dtype_bytes(t, 6) * 8, static_cast<size_t>(dtype_bits(t)) * 6) << dtype_name(t);
    EXPECT_EQ(dtype_bytes(t, 0), 0u);
  }
  EXPECT_THROW(dtype_bytes(DType::kE2M1, 3), Error);
  EXPECT_THROW(dtype_bytes(DType::kF32, std::numeric_limits<size_t>::max() / 2), Error);
  EXPECT_THROW(dtype_bits(static_cast<DType>(200)), Error);
}

TEST(DType, OddE2M1CountMessageNamesTheProblem) {
  try {
    dtype_bytes(DType::kE2M1, 7);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("e2m1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("7"), std::string::npos) << msg;
  }
}

TEST(DType, IsFloat) {
  EXPECT_TRUE(dtype_is_float(DType::kBF16));
  EXPECT_TRUE(dtype_is_float(DType::kE2M1));
  EXPECT_TRUE(dtype_is_float(DType::kF64));
  EXPECT_FALSE(dtype_is_float(DType::kI8));
  EXPECT_FALSE(dtype_is_float(DType::kBool));
}

// Properties that hold whatever the oracle: every finite code of each narrow format is an
// f32 value that encodes back to the same code.
TEST(DType, NarrowCodesRoundTripThroughF32) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    if (std::isfinite(f16_to_f32(h))) {
      EXPECT_EQ(f32_to_f16(f16_to_f32(h)), h);
    }
    if (!std::isnan(bf16_to_f32(h))) {
      EXPECT_EQ(f32_to_bf16(bf16_to_f32(h)), h);
    }
  }
  for (uint32_t c = 0; c < 256; ++c) {
    const auto b = static_cast<uint8_t>(c);
    if (!std::isnan(f8e4m3_to_f32(b))) {
      EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(b)), b);
    }
    if (!std::isnan(f8e5m2_to_f32(b))) {
      EXPECT_EQ(f32_to_f8e5m2(f8e5m2_to_f32(b)), b);
    }
    if (b != 0xFF) {
      EXPECT_EQ(f32_to_e8m0(e8m0_to_f32(b)), b);
    }
  }
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(c)), c);
}

TEST(DType, ToF32Integers) {
  const int8_t i8[] = {-128, -1, 0, 127};
  const uint8_t u8[] = {0, 1, 200, 255};
  const int16_t i16[] = {-32768, -3, 5, 32767};
  const int32_t i32[] = {-7, 0, 16777217, 123};
  const int64_t i64[] = {-(int64_t{1} << 40), 9, 0, int64_t{1} << 62};
  const uint8_t b8[] = {0, 1, 2, 0};
  const double f64[] = {0.1, -1e300, 1e-300, 3.5};
  float out[4];
  auto expect = [&](auto& src, DType t) {
    to_f32(src, t, out, 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], static_cast<float>(src[i])) << dtype_name(t);
  };
  expect(i8, DType::kI8);
  expect(u8, DType::kU8);
  expect(i16, DType::kI16);
  expect(i32, DType::kI32);
  expect(i64, DType::kI64);
  expect(f64, DType::kF64);
  to_f32(b8, DType::kBool, out, 4);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], 1.0f);  // any non-zero byte is true
  EXPECT_EQ(out[3], 0.0f);
}

TEST(DType, BulkHandlesUnalignedSources) {
  const float vals[] = {1.0f, -2.5f, 3.25f, 1e-3f, 65504.0f};
  std::vector<unsigned char> buf(1 + sizeof(uint16_t) * 5);
  from_f32(vals, DType::kF16, buf.data() + 1, 5);  // odd address on purpose
  float out[5];
  to_f32(buf.data() + 1, DType::kF16, out, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], f16_to_f32(f32_to_f16(vals[i])));
}

TEST(DType, BulkF32AndF64) {
  const float vals[] = {1.5f, -0.0f, std::numeric_limits<float>::infinity()};
  float out[3];
  to_f32(vals, DType::kF32, out, 3);
  EXPECT_EQ(std::memcmp(vals, out, sizeof vals), 0);
  double d[3];
  from_f32(vals, DType::kF64, d, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(d[i], static_cast<double>(vals[i]));
  to_f32(nullptr, DType::kF32, nullptr, 0);  // n == 0 touches nothing
}

TEST(DType, E2M1OddCountLeavesHighNibbleZero) {
  const float vals[] = {1.0f, -6.0f, 0.5f};
  uint8_t packed[2] = {0xAA, 0xAA};
  from_f32(vals, DType::kE2M1, packed, 3);
  EXPECT_EQ(packed[0], 0x2 | (0xF << 4));  // 1.0 -> code 2 low nibble, -6 -> code 0xF high
  EXPECT_EQ(packed[1], 0x1);               // 0.5 -> code 1, high nibble written as 0
  float out[3];
  to_f32(packed, DType::kE2M1, out, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -6.0f);
  EXPECT_EQ(out[2], 0.5f);
}

TEST(DType, FromF32RejectsIntegerTargets) {
  const float x = 1.0f;
  int32_t out = 0;
  for (DType t : {DType::kI8, DType::kU8, DType::kI16, DType::kI32, DType::kI64, DType::kBool}) {
    EXPECT_THROW(from_f32(&x, t, &out, 1), Error) << dtype_name(t);
  }
  EXPECT_EQ(out, 0);
}

}  // namespace
}  // namespace metrale
