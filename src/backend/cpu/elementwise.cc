// Row-wise kernels: rms_norm (+ fused residual, per-group, silu-gated), layer_norm, RoPE, gated and
// plain activations and
// the bf16 -> f32 widening of embedding rows. Full vectors go through SIMD; the last partial vector
// goes through the same formula in scalar code (or a zero-padded vector where a transcendental is
// involved), so results never depend on a pointer's alignment. Highway re-includes this file once
// per target: these lines keep their order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "backend/cpu/activation-inl.h"
// clang-format on
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int64_t kMaxLanes = 64 / sizeof(float);  // widest x86 vector: tail buffers

// Sum of squares, fixed order: vector lanes over full vectors, then the scalar tail.
float SumSquares(const float* x, int64_t n) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  VF acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) {
    const VF v = hn::LoadU(df, x + i);
    acc = hn::MulAdd(v, v, acc);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

void RmsNormRows(const RmsNormArgs& a, int64_t r_begin, int64_t r_end) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n = a.x.n_cols;
  const int64_t group = a.group > 0 ? a.group : n;
  const bool one_plus = a.style == NormStyle::kOnePlusWeight;
  const VF one = hn::Set(df, 1.0f);
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* src = a.x.row(r);
    if (a.residual.data != nullptr) {
      float* h = a.residual.row(r);
      int64_t i = 0;
      for (; i + nl <= n; i += nl)
        hn::StoreU(hn::Add(hn::LoadU(df, h + i), hn::LoadU(df, src + i)), df, h + i);
      for (; i < n; ++i) h[i] += src[i];
      src = h;
    }
    float* out = a.out.row(r);
    for (int64_t g0 = 0; g0 < n; g0 += group) {
      const float* x = src + g0;
      float* y = out + g0;
      // HF: variance = mean(x^2); x * rsqrt(variance + eps); then weight * that.
      const float var = SumSquares(x, group) / static_cast<float>(group);
      const float inv = 1.0f / std::sqrt(var + a.eps);
      const VF vinv = hn::Set(df, inv);
      if (a.gate.data != nullptr) {  // HF RMSNormGated: (w * normed) * silu(gate)
        const float* gate = a.gate.row(r) + g0;
        for (int64_t i = 0; i < group; i += nl) {
          const int64_t m = std::min(nl, group - i);
          HWY_ALIGN float xt[kMaxLanes] = {}, wt[kMaxLanes] = {}, gt[kMaxLanes] = {};
          const float *xp = x + i, *wp = a.weight + i, *gp = gate + i;
          if (m < nl) {  // the tail through the same vector formula, zero-padded
            std::memcpy(xt, xp, static_cast<size_t>(m) * sizeof(float));
            std::memcpy(wt, wp, static_cast<size_t>(m) * sizeof(float));
            std::memcpy(gt, gp, static_cast<size_t>(m) * sizeof(float));
            xp = xt, wp = wt, gp = gt;
          }
          VF w = hn::LoadU(df, wp);
          if (one_plus) w = hn::Add(one, w);
          const VF v =
              hn::Mul(hn::Mul(hn::Mul(hn::LoadU(df, xp), vinv), w), Silu(df, hn::LoadU(df, gp)));
          if (m == nl) {
            hn::StoreU(v, df, y + i);
          } else {
            HWY_ALIGN float yt[kMaxLanes];
            hn::Store(v, df, yt);
            std::memcpy(y + i, yt, static_cast<size_t>(m) * sizeof(float));
          }
        }
        continue;
      }
      int64_t i = 0;
      for (; i + nl <= group; i += nl) {
        VF w = hn::LoadU(df, a.weight + i);
        if (one_plus) w = hn::Add(one, w);
        hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, x + i), vinv), w), df, y + i);
      }
      for (; i < group; ++i) {
        const float w = one_plus ? 1.0f + a.weight[i] : a.weight[i];
        y[i] = (x[i] * inv) * w;
      }
    }
  }
}

// HF: q * cos + rotate_half(q) * sin, products rounded separately (no FMA) as torch does.
void RopeRows(const RopeArgs& a, int64_t r_begin, int64_t r_end) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const int64_t half = a.table.rotary_dim / 2;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const int64_t pos = a.positions[static_cast<size_t>(r)];
    const float* c = a.table.cos + pos * half;
    const float* s = a.table.sin + pos * half;
    for (int64_t h = 0; h < a.n_heads; ++h) {
      float* x1 = a.x.row(r) + h * a.head_dim + a.offset;
      if (a.pairs) {  // HF apply_rotary_pos_emb_interleave: (x1 cos - x2 sin, x2 cos + x1 sin)
        for (int64_t i = 0; i < half; ++i) {
          const float v1 = x1[2 * i], v2 = x1[2 * i + 1];
          x1[2 * i] = v1 * c[i] - v2 * s[i];
          x1[2 * i + 1] = v2 * c[i] + v1 * s[i];
        }
        continue;
      }
      float* x2 = x1 + half;
      int64_t i = 0;
      for (; i + nl <= half; i += nl) {
        const VF v1 = hn::LoadU(df, x1 + i), v2 = hn::LoadU(df, x2 + i);
        const VF vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
        hn::StoreU(hn::Sub(hn::Mul(v1, vc), hn::Mul(v2, vs)), df, x1 + i);
        hn::StoreU(hn::Add(hn::Mul(v2, vc), hn::Mul(v1, vs)), df, x2 + i);
      }
      for (; i < half; ++i) {
        const float v1 = x1[i], v2 = x2[i];
        x1[i] = v1 * c[i] - v2 * s[i];
        x2[i] = v2 * c[i] + v1 * s[i];
      }
    }
  }
}

void GatedActivationRows(const GatedActivationArgs& a, int64_t r_begin, int64_t r_end) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n = a.gate.n_cols;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* g = a.gate.row(r);
    const float* u = a.up.row(r);
    float* y = a.out.row(r);
    int64_t i = 0;
    for (; i + nl <= n; i += nl) {
      const VF v = hn::Mul(Activate(df, hn::LoadU(df, g + i), a.act), hn::LoadU(df, u + i));
      hn::StoreU(v, df, y + i);
    }
    if (i < n) {
      HWY_ALIGN float gt[64 / sizeof(float)] = {};
      HWY_ALIGN float ut[64 / sizeof(float)] = {};
      HWY_ALIGN float yt[64 / sizeof(float)];
      const auto rest = static_cast<size_t>(n - i);
      std::memcpy(gt, g + i, rest * sizeof(float));
      std::memcpy(ut, u + i, rest * sizeof(float));
      hn::Store(hn::Mul(Activate(df, hn::Load(df, gt), a.act), hn::Load(df, ut)), df, yt);
      std::memcpy(y + i, yt, rest * sizeof(float));
    }
  }
}

void ActivationRows(const ActivationArgs& a, int64_t r_begin, int64_t r_end) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n = a.x.n_cols;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* x = a.x.row(r);
    float* y = a.out.row(r);
    int64_t i = 0;
    for (; i + nl <= n; i += nl) hn::StoreU(Activate(df, hn::LoadU(df, x + i), a.act), df, y + i);
    if (i < n) {  // the tail through the same vector formula, zero-padded
      HWY_ALIGN float xt[kMaxLanes] = {};
      HWY_ALIGN float yt[kMaxLanes];
      const auto rest = static_cast<size_t>(n - i);
      std::memcpy(xt, x + i, rest * sizeof(float));
      hn::Store(Activate(df, hn::Load(df, xt), a.act), df, yt);
      std::memcpy(y + i, yt, rest * sizeof(float));
    }
  }
}

// Sum, fixed order: vector lanes over full vectors, then the scalar tail.
float Sum(const float* x, int64_t n) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  VF acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) acc = hn::Add(acc, hn::LoadU(df, x + i));
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += x[i];
  return s;
}

// Sum of (x - mean)^2, the same order.
float SumSquaredDeviations(const float* x, int64_t n, float mean) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const VF vm = hn::Set(df, mean);
  VF acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) {
    const VF d = hn::Sub(hn::LoadU(df, x + i), vm);
    acc = hn::MulAdd(d, d, acc);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

// Two passes (mean, then the variance about it), then (x - mean) * rstd * w + b.
void LayerNormRows(const LayerNormArgs& a, int64_t r_begin, int64_t r_end) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n = a.x.n_cols;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* x = a.x.row(r);
    float* y = a.out.row(r);
    const float mean = Sum(x, n) / static_cast<float>(n);
    const float var = SumSquaredDeviations(x, n, mean) / static_cast<float>(n);
    const float rstd = 1.0f / std::sqrt(var + a.eps);
    const VF vm = hn::Set(df, mean), vr = hn::Set(df, rstd);
    int64_t i = 0;
    for (; i + nl <= n; i += nl) {
      VF v = hn::Mul(hn::Mul(hn::Sub(hn::LoadU(df, x + i), vm), vr), hn::LoadU(df, a.weight + i));
      if (a.bias != nullptr) v = hn::Add(v, hn::LoadU(df, a.bias + i));
      hn::StoreU(v, df, y + i);
    }
    for (; i < n; ++i) {
      float v = ((x[i] - mean) * rstd) * a.weight[i];
      if (a.bias != nullptr) v += a.bias[i];
      y[i] = v;
    }
  }
}

void WidenBf16(const uint16_t* src, int64_t n, float* dst) {
  const DF df;
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const auto* p = reinterpret_cast<const hwy::bfloat16_t*>(src);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dbf, p + i)), df, dst + i);
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof(float));
  }
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale::cpu {
HWY_EXPORT(RmsNormRows);
HWY_EXPORT(RopeRows);
HWY_EXPORT(GatedActivationRows);
HWY_EXPORT(WidenBf16);
HWY_EXPORT(ActivationRows);
HWY_EXPORT(LayerNormRows);

void activation_rows(const ActivationArgs& a, int64_t b, int64_t e) {
  HWY_DYNAMIC_DISPATCH(ActivationRows)(a, b, e);
}
void layer_norm_rows(const LayerNormArgs& a, int64_t b, int64_t e) {
  HWY_DYNAMIC_DISPATCH(LayerNormRows)(a, b, e);
}

void rms_norm_rows(const RmsNormArgs& a, int64_t b, int64_t e) {
  HWY_DYNAMIC_DISPATCH(RmsNormRows)(a, b, e);
}
void rope_rows(const RopeArgs& a, int64_t b, int64_t e) { HWY_DYNAMIC_DISPATCH(RopeRows)(a, b, e); }
void gated_activation_rows(const GatedActivationArgs& a, int64_t b, int64_t e) {
  HWY_DYNAMIC_DISPATCH(GatedActivationRows)(a, b, e);
}
void widen_bf16(const uint16_t* src, int64_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(WidenBf16)(src, n, dst);
}
}  // namespace metrale::cpu
#endif
