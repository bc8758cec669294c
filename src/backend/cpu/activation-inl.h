// The vector activations shared by the CPU kernels (gated activation, gated rms_norm, causal
// conv, sigmoid_mul), so that every op computes silu and sigmoid with the same bits.
// Per-target include guard (Highway's toggle idiom); include after hwy/highway.h.
#if defined(METRALE_BACKEND_CPU_ACTIVATION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef METRALE_BACKEND_CPU_ACTIVATION_INL_H_
#undef METRALE_BACKEND_CPU_ACTIVATION_INL_H_
#else
#define METRALE_BACKEND_CPU_ACTIVATION_INL_H_
#endif

#include "backend/backend.h"  // Activation
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

// erfc(z) for z >= 0: Numerical Recipes' Chebyshev fit (erfcc), fractional error below 1.2e-7:
// t exp(-z^2 - 1.26551223 + t P(t)), t = 1 / (1 + z / 2).
template <class D, class V>
HWY_INLINE V ErfcNonNegative(D d, V z) {
  const V t = hn::Div(hn::Set(d, 1.0f), hn::MulAdd(hn::Set(d, 0.5f), z, hn::Set(d, 1.0f)));
  V p = hn::Set(d, 0.17087277f);
  for (float c : {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f, 0.09678418f,
                  0.37409196f, 1.00002368f, -1.26551223f}) {
    p = hn::MulAdd(p, t, hn::Set(d, c));
  }
  return hn::Mul(t, hn::Exp(d, hn::Sub(p, hn::Mul(z, z))));
}

// torch's gelu (erf form): 0.5 x (1 + erf(x / sqrt(2))). 1 + erf(z) is written as 2 - erfc(z)
// for z >= 0 and erfc(-z) for z < 0, so negative inputs keep their relative accuracy.
template <class D, class V>
HWY_INLINE V GeluErf(D d, V x) {
  const V z = hn::Mul(x, hn::Set(d, 0.70710678118654752f));
  const V e = ErfcNonNegative(d, hn::Abs(z));
  const V one_plus_erf = hn::IfThenElse(hn::Lt(z, hn::Zero(d)), e, hn::Sub(hn::Set(d, 2.0f), e));
  return hn::Mul(hn::Mul(hn::Set(d, 0.5f), x), one_plus_erf);
}

// One activation by kind (gated_activation, activation): every op computes each with the same
// bits.
template <class D, class V>
HWY_INLINE V Activate(D d, V x, Activation act) {
  switch (act) {
    case Activation::kSilu:
      return Silu(d, x);
    case Activation::kGeluTanh: {
      // torch's gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
      const V inner =
          hn::Mul(hn::Set(d, 0.7978845608028654f),
                  hn::Add(x, hn::Mul(hn::Set(d, 0.044715f), hn::Mul(x, hn::Mul(x, x)))));
      return hn::Mul(hn::Mul(hn::Set(d, 0.5f), x), hn::Add(hn::Set(d, 1.0f), hn::Tanh(d, inner)));
    }
    case Activation::kGelu:
      return GeluErf(d, x);
    case Activation::kQuickGelu:  // transformers' QuickGELUActivation: x * sigmoid(1.702 x)
      return hn::Mul(x, Sigmoid(d, hn::Mul(hn::Set(d, 1.702f), x)));
  }
  return x;
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // METRALE_BACKEND_CPU_ACTIVATION_INL_H_ (per target)
