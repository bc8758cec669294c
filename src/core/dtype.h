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
// Bytes occupied by `n` elements. kE2M1 packs two per byte, so n must be even; an odd n or
// a byte count past SIZE_MAX throws metrale::Error.
size_t dtype_bytes(DType t, size_t n);
// Short lower-case name for messages: "bf16", "f8_e4m3", ...
std::string_view dtype_name(DType t);
// The safetensors header spelling ("BF16", "F8_E4M3", ...) and back. Unknown -> nullopt.
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view s);
bool dtype_is_float(DType t);

// --- scalar conversions (bit patterns in, bit patterns out) ---
// Every function but e2m1's (torch has no e2m1 cast; the NVFP4 quantizer of vLLM /
// compressed-tensors is the reference) matches torch 2.15 `Tensor.to()` on CPU bit for bit,
// NaN payloads included: the vectorised body of torch's portable kernel. torch's own paths
// differ among themselves only in NaN payloads (its AVX512 kernel gives bf16 NaN as 0xFFFF).
// tools/fixtures/dtype/make_dtype_golden.py records the oracle; dtype_convert.cc gives the
// rules and why.
uint16_t f32_to_bf16(float x);   // RNE; any NaN -> 0x7FC0
float bf16_to_f32(uint16_t h);   // exact (bits << 16)
uint16_t f32_to_f16(float x);    // RNE; overflow -> inf; NaN keeps sign and top payload, quiet
float f16_to_f32(uint16_t h);    // exact; NaN keeps sign and payload, quiet
uint8_t f32_to_f8e4m3(float x);  // RNE; beyond +-448 (and +-inf) saturates; NaN -> S.1111.111
float f8e4m3_to_f32(uint8_t b);
uint8_t f32_to_f8e5m2(float x);  // RNE; overflow -> inf; NaN -> S.11111.11
float f8e5m2_to_f32(uint8_t b);
uint8_t f32_to_e2m1(float x);       // code in the low nibble; RNE; inf/NaN saturate to +-6
float e2m1_to_f32(uint8_t nibble);  // uses the low nibble only
uint8_t f32_to_e8m0(float x);       // RNE on the exponent; the sign is ignored; inf/NaN -> 0xFF
float e8m0_to_f32(uint8_t b);       // 2^(b-127); 0xFF -> NaN

// --- bulk conversions ---
// `n` counts elements. kE2M1 is packed two per byte, element 2i in the low nibble of byte i
// (as torch.float4_e2m1fn_x2 / compressed-tensors / ModelOpt pack); for odd `n` the last
// byte's high nibble is ignored on read and written as 0. to_f32 accepts every DType
// (integers convert as static_cast<float>); from_f32 accepts the floating types only and
// throws metrale::Error otherwise.
void to_f32(const void* src, DType src_type, float* dst, size_t n);
void from_f32(const float* src, DType dst_type, void* dst, size_t n);

}  // namespace metrale
