#pragma once
// Element types and their scalar conversions. Conversions to narrow floats match PyTorch bit
// for bit: round to nearest, ties to even; the saturation and NaN rules of each format are
// spelled out beside its function.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace metrale {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8_e4m3fn: no inf, NaN = S.1111.111, max 448
  kF8E5M2,  // float8_e5m2: IEEE-like, has inf and NaN, max 57344
  kE2M1,    // fp4 (float4_e2m1fn_x2 packs two per byte, low nibble first): max 6, no inf/NaN
  kE8M0,    // float8_e8m0fnu: exponent only, 2^(e-127); 0xFF is NaN; no sign, no zero
  kI8,
  kU8,
  kI32,
  kI64,
  kBool,
  kI16,
  kF64,
};

// Storage size in bits of one element (4 for kE2M1).
int dtype_bits(DType t);
// Bytes occupied by `n` elements (kE2M1 packs two per byte; n must then be even).
size_t dtype_bytes(DType t, size_t n);
// Short lower-case name for messages: "bf16", "f8_e4m3", ...
std::string_view dtype_name(DType t);
// The safetensors header spelling ("BF16", "F8_E4M3", ...) and back. Unknown -> nullopt.
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view s);
bool dtype_is_float(DType t);

// --- scalar conversions (bit patterns in, bit patterns out) ---
uint16_t f32_to_bf16(float x);   // RNE; NaN stays NaN (quiet), as torch
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float x);    // RNE; overflow -> inf, as torch
float f16_to_f32(uint16_t h);
uint8_t f32_to_f8e4m3(float x);  // RNE; |x| beyond max saturates? no: torch gives NaN (see .cc)
float f8e4m3_to_f32(uint8_t b);
uint8_t f32_to_f8e5m2(float x);  // RNE; overflow -> inf, as torch
float f8e5m2_to_f32(uint8_t b);
uint8_t f32_to_e2m1(float x);    // 4-bit code in the low nibble; RNE, saturates to +-6
float e2m1_to_f32(uint8_t nibble);
uint8_t f32_to_e8m0(float x);    // see .cc for rounding
float e8m0_to_f32(uint8_t b);

}  // namespace metrale
