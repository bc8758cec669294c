// The vector activations shared by the CPU kernels (gated activation, gated rms_norm, causal
// conv, sigmoid_mul), so that every op computes silu and sigmoid with the same bits.
// Per-target include guard (Highway's toggle idiom); include after hwy/highway.h.
#if defined(METRALE_BACKEND_CPU_ACTIVATION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef METRALE_BACKEND_CPU_ACTIVATION_INL_H_
#undef METRALE_BACKEND_CPU_ACTIVATION_INL_H_
#else
#define METRALE_BACKEND_CPU_ACTIVATION_INL_H_
#endif

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(-x), with -x clamped to Highway's Exp range (+104): past ~88.7 the result is inf either
// way, as torch's is, so 1 + exp(-x) = inf and sigmoid / silu go to 0 as in torch. (x86's
// min returns its second operand when one is NaN: a NaN x stays NaN.)
template <class D, class V>
HWY_INLINE V ExpNeg(D d, V x) {
  return hn::Exp(d, hn::Min(hn::Set(d, 100.0f), hn::Neg(x)));
}

// torch's silu: x / (1 + exp(-x)).
template <class D, class V>
HWY_INLINE V Silu(D d, V x) {
  return hn::Div(x, hn::Add(hn::Set(d, 1.0f), ExpNeg(d, x)));
}

// torch's sigmoid: 1 / (1 + exp(-x)).
template <class D, class V>
HWY_INLINE V Sigmoid(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, ExpNeg(d, x)));
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // METRALE_BACKEND_CPU_ACTIVATION_INL_H_ (per target)
