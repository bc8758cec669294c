// Reading KV cache elements (KvLayout::dtype: f32, f16 or bf16) as f32, for the attention
// kernels; included once per Highway target by attention.cc / latent_attention.cc. Widening
// is exact for every element type, so a kernel's arithmetic is the same for all of them.
// Per-target include guard (Highway's toggle idiom).
#if defined(METRALE_BACKEND_CPU_KV_ELEMENTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef METRALE_BACKEND_CPU_KV_ELEMENTS_INL_H_
#undef METRALE_BACKEND_CPU_KV_ELEMENTS_INL_H_
#else
#define METRALE_BACKEND_CPU_KV_ELEMENTS_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace kv {
namespace hn = hwy::HWY_NAMESPACE;

// Targets converting f16 in hardware (F16C); below them f16 lanes widen one by one with
// core/dtype's exact conversion.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
inline constexpr bool kHardwareF16 = true;
#else
inline constexpr bool kHardwareF16 = false;
#endif

// One cache element as f32.
template <typename T>
HWY_INLINE float Widen(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    uint16_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return std::is_same_v<T, hwy::bfloat16_t> ? bf16_to_f32(bits) : f16_to_f32(bits);
  }
}

// One vector of consecutive cache elements from p (any alignment) as f32.
template <typename T, class DF>
HWY_INLINE hn::Vec<DF> LoadWide(DF df, const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<T, hwy::bfloat16_t> || kHardwareF16) {
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<T, DF>(), p));
  } else {
    constexpr size_t kMax = 64 / sizeof(float);  // widest vector of any x86 target
    HWY_ALIGN float t[kMax];
    const size_t n = hn::Lanes(df);
    for (size_t i = 0; i < n && i < kMax; ++i) t[i] = Widen(p[i]);
    return hn::Load(df, t);
  }
}

// Calls f(T{}) with T the C++ element type of `dtype` (float, hwy::float16_t, hwy::bfloat16_t).
template <class F>
HWY_INLINE decltype(auto) WithElementType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF16:
      return f(hwy::float16_t{});
    case DType::kBF16:
      return f(hwy::bfloat16_t{});
    default:
      return f(float{});
  }
}

}  // namespace kv
}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // METRALE_BACKEND_CPU_KV_ELEMENTS_INL_H_
