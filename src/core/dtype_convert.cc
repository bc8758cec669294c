// Scalar and bulk conversions between f32 and the narrow float formats.
//
// The oracle is torch 2.15 `Tensor.to()` on CPU (its portable kernel); the golden test
// (tests/core/dtype_golden_test.cc) compares every 8- and 16-bit decode and ~28k encodes bit
// for bit. Facts learned from that oracle, which older torch releases did differently:
//  - e4m3fn saturates: every finite |x| rounding past 448, and +-inf, gives +-448; only NaN
//    gives the NaN code. (torch <= 2.5 returned NaN for |x| >= 480.)
//  - f16 -> f32 and e5m2 -> f32 keep a NaN's sign and payload (quieted); f32 -> bf16 turns
//    every NaN into 0x7FC0. (torch's scalar loop tails give 0x7FFFFFFF for f16 NaNs and its
//    AVX512 kernel gives bf16 0xFFFF: only NaN payloads differ between torch's own paths.)
// e2m1 has no torch cast: we follow the NVFP4 quantizer of vLLM / compressed-tensors (round
// to nearest even on the grid 0, .5, 1, 1.5, 2, 3, 4, 6; saturate to +-6; keep the sign bit,
// so -0 and tiny negatives give code 0x8) and torchao's bit-level rule for NaN (its
// magnitude bits exceed the max, so it saturates to +-6 with its sign).
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace metrale {
namespace {

inline uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

inline float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;

// Rounds a finite non-negative f32 (bits `abs`) to a binary float with `man_bits` mantissa
// bits, exponent bias `bias`, subnormals and no upper limit: round to nearest, ties to even.
// Returns the magnitude code (exponent field << man_bits | mantissa); codes past the format's
// largest finite value are the caller's overflow rule to apply.
inline uint32_t round_magnitude(uint32_t abs, int man_bits, int bias) {
  const int e = static_cast<int>(abs >> 23);
  const uint32_t m = (abs & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);  // hidden bit included
  const int exp = (e != 0 ? e : 1) - 127;                            // of m's bit 23
  const int exp_min = 1 - bias;  // smallest normal exponent of the target
  int shift = 23 - man_bits;
  uint32_t base = 0;
  if (exp >= exp_min) {
    // q carries the hidden bit (1 << man_bits), so (E - 1) << man_bits + q == E.mantissa
    // and a rounding carry out of the mantissa bumps the exponent, as it should.
    base = static_cast<uint32_t>(exp + bias - 1) << man_bits;
  } else {
    shift += exp_min - exp;
    if (shift > 24) return 0;  // below half the smallest subnormal (m < 2^24 <= half)
  }
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
  return base + q;
}

// Value of a magnitude code of a format without inf/NaN handling (callers handle those).
inline float decode_magnitude(uint32_t code, int man_bits, int bias) {
  const uint32_t e = code >> man_bits;
  const uint32_t m = code & ((1u << man_bits) - 1u);
  if (e == 0) {
    // Subnormal: m * 2^(1 - bias - man_bits); the scale is a power of two in f32's range.
    const float scale = float_of(static_cast<uint32_t>(127 + 1 - bias - man_bits) << 23);
    return static_cast<float>(m) * scale;
  }
  return float_of((static_cast<uint32_t>(static_cast<int>(e) - bias + 127) << 23) |
                  (m << (23 - man_bits)));
}

inline float with_sign(float x, bool negative) {
  return negative ? float_of(bits_of(x) | 0x80000000u) : x;
}

}  // namespace

uint16_t f32_to_bf16(float x) {
  const uint32_t b = bits_of(x);
  if ((b & kAbsMask) > kInfBits) return 0x7FC0;
  // Adding 0x7FFF plus the kept lsb rounds to nearest even; a carry reaching the exponent
  // field is the correct round-up, up to inf past the bf16 max.
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_f16(float x) {
  const uint32_t b = bits_of(x);
  const auto sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t abs = b & kAbsMask;
  if (abs > kInfBits) return static_cast<uint16_t>(sign | 0x7E00u | ((abs & 0x7FFFFFu) >> 13));
  if (abs >= kInfBits) return static_cast<uint16_t>(sign | 0x7C00u);
  const uint32_t code = round_magnitude(abs, 10, 15);
  return static_cast<uint16_t>(sign | (code >= 0x7C00u ? 0x7C00u : code));
}

float f16_to_f32(uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const uint32_t code = h & 0x7FFFu;
  if (code > 0x7C00u) {
    // Quiet NaN keeping sign and payload, as x86 vcvtph2ps (torch's vectorised kernel).
    return float_of((negative ? 0x80000000u : 0u) | 0x7FC00000u | ((code & 0x3FFu) << 13));
  }
  if (code == 0x7C00u) return with_sign(float_of(kInfBits), negative);
  return with_sign(decode_magnitude(code, 10, 15), negative);
}

uint8_t f32_to_f8e4m3(float x) {
  const uint32_t b = bits_of(x);
  const auto sign = static_cast<uint8_t>((b >> 24) & 0x80u);
  const uint32_t abs = b & kAbsMask;
  if (abs > kInfBits) return static_cast<uint8_t>(sign | 0x7Fu);
  if (abs == kInfBits) return static_cast<uint8_t>(sign | 0x7Eu);
  const uint32_t code = round_magnitude(abs, 3, 7);
  return static_cast<uint8_t>(sign | (code > 0x7Eu ? 0x7Eu : code));
}

float f8e4m3_to_f32(uint8_t b) {
  const bool negative = (b & 0x80u) != 0;
  const uint32_t code = b & 0x7Fu;
  if (code == 0x7Fu) return float_of((negative ? 0x80000000u : 0u) | 0x7FF00000u);
  return with_sign(decode_magnitude(code, 3, 7), negative);
}

uint8_t f32_to_f8e5m2(float x) {
  const uint32_t b = bits_of(x);
  const auto sign = static_cast<uint8_t>((b >> 24) & 0x80u);
  const uint32_t abs = b & kAbsMask;
  if (abs > kInfBits) return static_cast<uint8_t>(sign | 0x7Fu);
  if (abs == kInfBits) return static_cast<uint8_t>(sign | 0x7Cu);
  const uint32_t code = round_magnitude(abs, 2, 15);
  return static_cast<uint8_t>(sign | (code >= 0x7Cu ? 0x7Cu : code));
}

float f8e5m2_to_f32(uint8_t b) {
  const bool negative = (b & 0x80u) != 0;
  const uint32_t code = b & 0x7Fu;
  if (code > 0x7Cu) {
    // A quiet f32 NaN carrying the two payload bits in its top mantissa bits.
    return float_of((negative ? 0x80000000u : 0u) | 0x7FC00000u | ((code & 3u) << 21));
  }
  if (code == 0x7Cu) return with_sign(float_of(kInfBits), negative);
  return with_sign(decode_magnitude(code, 2, 15), negative);
}

uint8_t f32_to_e2m1(float x) {
  const uint32_t b = bits_of(x);
  const auto sign = static_cast<uint8_t>((b >> 28) & 0x8u);
  const uint32_t abs = b & kAbsMask;
  if (abs >= kInfBits) return static_cast<uint8_t>(sign | 0x7u);  // inf and NaN saturate
  const uint32_t code = round_magnitude(abs, 1, 1);
  return static_cast<uint8_t>(sign | (code > 0x7u ? 0x7u : code));
}

float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return with_sign(kGrid[nibble & 0x7u], (nibble & 0x8u) != 0);
}

uint8_t f32_to_e8m0(float x) {
  const uint32_t b = bits_of(x);
  const uint32_t e = (b >> 23) & 0xFFu;  // the sign is dropped: e8m0 scales are unsigned
  if (e == 0xFFu) return 0xFF;
  // Round the significand 1.m (0.m for f32 subnormals) to a power of two: up when the
  // first dropped bit is set and either more bits follow or the kept bit (the hidden bit,
  // 1 for normals) is odd. e == 254 rounding up lands on 0xFF, the NaN code, as in torch.
  const bool guard = (b & 0x400000u) != 0;
  const bool rest = (b & 0x3FFFFFu) != 0;
  const bool round_up = guard && (rest || e != 0);
  return static_cast<uint8_t>(e + (round_up ? 1u : 0u));
}

float e8m0_to_f32(uint8_t b) {
  if (b == 0xFFu) return float_of(0x7F800001u);
  if (b == 0) return float_of(0x00400000u);  // 2^-127 is an f32 subnormal
  return float_of(static_cast<uint32_t>(b) << 23);
}

}  // namespace metrale
