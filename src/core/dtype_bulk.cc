// Bulk to_f32 / from_f32 over the scalar conversions of dtype_convert.cc. Sources may be
// unaligned (tensors inside an mmapped safetensors file), so multi-byte loads use memcpy,
// which compilers turn into plain loads.
#include <array>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace metrale {
namespace {

template <typename T>
inline T load(const unsigned char* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
inline void store(unsigned char* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

using Table256 = std::array<float, 256>;

// Every 8-bit code decoded once; a table lookup beats the branches of the scalar decoders.
template <float (*Decode)(uint8_t)>
const Table256& table() {
  static const Table256 t = [] {
    Table256 r{};
    for (size_t c = 0; c < r.size(); ++c) r[c] = Decode(static_cast<uint8_t>(c));
    return r;
  }();
  return t;
}

void lookup(const unsigned char* s, const Table256& t, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = t[s[i]];
}

template <typename T>
void widen(const unsigned char* s, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<T>(s, i));
}

template <typename T, T (*Encode)(float)>
void narrow(const float* src, unsigned char* d, size_t n) {
  for (size_t i = 0; i < n; ++i) store<T>(d, i, Encode(src[i]));
}

}  // namespace

void to_f32(const void* src, DType src_type, float* dst, size_t n) {
  const auto* s = static_cast<const unsigned char*>(src);
  switch (src_type) {
    case DType::kF32:
      if (n != 0) std::memcpy(dst, s, n * sizeof(float));
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load<uint16_t>(s, i));
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load<uint16_t>(s, i));
      return;
    case DType::kF8E4M3:
      return lookup(s, table<f8e4m3_to_f32>(), dst, n);
    case DType::kF8E5M2:
      return lookup(s, table<f8e5m2_to_f32>(), dst, n);
    case DType::kE8M0:
      return lookup(s, table<e8m0_to_f32>(), dst, n);
    case DType::kE2M1:
      for (size_t i = 0; i < n; ++i) {
        dst[i] = e2m1_to_f32(static_cast<uint8_t>(s[i / 2] >> ((i % 2) * 4)));
      }
      return;
    case DType::kI8:
      return widen<int8_t>(s, dst, n);
    case DType::kU8:
      return widen<uint8_t>(s, dst, n);
    case DType::kI16:
      return widen<int16_t>(s, dst, n);
    case DType::kI32:
      return widen<int32_t>(s, dst, n);
    case DType::kI64:
      return widen<int64_t>(s, dst, n);
    case DType::kF64:
      return widen<double>(s, dst, n);
    case DType::kBool:
      for (size_t i = 0; i < n; ++i) dst[i] = s[i] != 0 ? 1.0f : 0.0f;
      return;
  }
  throw make_error("to_f32: invalid DType value ", static_cast<int>(src_type));
}

void from_f32(const float* src, DType dst_type, void* dst, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  switch (dst_type) {
    case DType::kF32:
      if (n != 0) std::memcpy(d, src, n * sizeof(float));
      return;
    case DType::kBF16:
      return narrow<uint16_t, f32_to_bf16>(src, d, n);
    case DType::kF16:
      return narrow<uint16_t, f32_to_f16>(src, d, n);
    case DType::kF8E4M3:
      return narrow<uint8_t, f32_to_f8e4m3>(src, d, n);
    case DType::kF8E5M2:
      return narrow<uint8_t, f32_to_f8e5m2>(src, d, n);
    case DType::kE8M0:
      return narrow<uint8_t, f32_to_e8m0>(src, d, n);
    case DType::kE2M1:
      for (size_t i = 0; i + 1 < n; i += 2) {
        d[i / 2] = static_cast<unsigned char>(f32_to_e2m1(src[i]) | (f32_to_e2m1(src[i + 1]) << 4));
      }
      if (n % 2 != 0) d[n / 2] = f32_to_e2m1(src[n - 1]);
      return;
    case DType::kF64:
      for (size_t i = 0; i < n; ++i) store<double>(d, i, static_cast<double>(src[i]));
      return;
    case DType::kI8:
    case DType::kU8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      throw make_error("from_f32: cannot convert f32 to ", dtype_name(dst_type),
                       "; integer targets need an explicit rounding and saturation rule");
  }
  throw make_error("from_f32: invalid DType value ", static_cast<int>(dst_type));
}

}  // namespace metrale
