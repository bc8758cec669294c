// Non-causal attention within segments of rows (a vision tower's attention per image / frame).
// Keys are first transposed per head, so a query's scores against a block of keys are vertical
// multiply-adds over head_dim with the keys on the vector lanes (as the paged attention's
// page-transposed K); the softmax and the weighted values then run in key order. Every
// output's arithmetic is fixed by its row and segment, never by the thread split. Highway
// re-includes this file once per target: these lines keep their order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/varlen_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
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
constexpr int64_t kMaxLanes = 64 / sizeof(float);

void VarlenTransposeKeys(const VarlenAttentionArgs& a, float* keys_t, int64_t item_begin,
                         int64_t item_end) {
  const int64_t n = a.k.n_rows, D = a.head_dim;
  const int64_t blocks = (n + kVarlenRowBlock - 1) / kVarlenRowBlock;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t h = item / blocks, r0 = item % blocks * kVarlenRowBlock;
    const int64_t r1 = std::min(n, r0 + kVarlenRowBlock);
    for (int64_t r = r0; r < r1; ++r) {
      const float* k = a.k.row(r) + h * D;
      for (int64_t d = 0; d < D; ++d) keys_t[(h * D + d) * n + r] = k[d];
    }
  }
}

void VarlenAttentionItems(const VarlenAttentionArgs& a, const float* keys_t, int64_t item_begin,
                          int64_t item_end, float* scores) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n = a.q.n_rows, D = a.head_dim, H = a.n_heads;
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const VF vscale = hn::Set(df, scale);
  const std::span<const int32_t> cu = a.cu_seqlens;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t r = item / H, h = item % H;
    // The segment holding row r: the last start at or before it.
    const auto seg = std::upper_bound(cu.begin(), cu.end(), static_cast<int32_t>(r)) - 1;
    const int64_t s0 = *seg, s1 = *(seg + 1), len = s1 - s0;
    const float* q = a.q.row(r) + h * D;
    const float* kt = keys_t + h * D * n + s0;  // kt[d * n + j]: key s0 + j, dim d
    // Scores: sum over d in order, then times scale (torch: (q k^T) * scale).
    int64_t j = 0;
    for (; j + 4 * nl <= len; j += 4 * nl) {
      VF c0 = hn::Zero(df), c1 = hn::Zero(df), c2 = hn::Zero(df), c3 = hn::Zero(df);
      for (int64_t d = 0; d < D; ++d) {
        const VF vq = hn::Set(df, q[d]);
        const float* row = kt + d * n + j;
        c0 = hn::MulAdd(vq, hn::LoadU(df, row), c0);
        c1 = hn::MulAdd(vq, hn::LoadU(df, row + nl), c1);
        c2 = hn::MulAdd(vq, hn::LoadU(df, row + 2 * nl), c2);
        c3 = hn::MulAdd(vq, hn::LoadU(df, row + 3 * nl), c3);
      }
      hn::StoreU(hn::Mul(c0, vscale), df, scores + j);
      hn::StoreU(hn::Mul(c1, vscale), df, scores + j + nl);
      hn::StoreU(hn::Mul(c2, vscale), df, scores + j + 2 * nl);
      hn::StoreU(hn::Mul(c3, vscale), df, scores + j + 3 * nl);
    }
    for (; j + nl <= len; j += nl) {
      VF c = hn::Zero(df);
      for (int64_t d = 0; d < D; ++d)
        c = hn::MulAdd(hn::Set(df, q[d]), hn::LoadU(df, kt + d * n + j), c);
      hn::StoreU(hn::Mul(c, vscale), df, scores + j);
    }
    for (; j < len; ++j) {  // the same fused multiply-adds, one key at a time
      float c = 0.0f;
      for (int64_t d = 0; d < D; ++d) c = std::fma(q[d], kt[d * n + j], c);
      scores[j] = c * scale;
    }
    // Softmax: the max, exp(score - max) (zero-padded tail through the same vector Exp), the
    // sum (lanes over full vectors, then the tail), all in key order.
    float mx = -INFINITY;
    for (int64_t t = 0; t < len; ++t) mx = std::max(mx, scores[t]);
    const VF vmx = hn::Set(df, mx);
    VF acc = hn::Zero(df);
    j = 0;
    for (; j + nl <= len; j += nl) {
      const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, scores + j), vmx));
      hn::StoreU(e, df, scores + j);
      acc = hn::Add(acc, e);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, acc));
    if (j < len) {
      HWY_ALIGN float t[kMaxLanes];
      const auto rest = static_cast<size_t>(len - j);
      for (size_t i = 0; i < static_cast<size_t>(nl); ++i)
        t[i] = i < rest ? scores[j + static_cast<int64_t>(i)] : mx;
      hn::Store(hn::Exp(df, hn::Sub(hn::Load(df, t), vmx)), df, t);
      for (size_t i = 0; i < rest; ++i) {
        scores[j + static_cast<int64_t>(i)] = t[i];
        sum += t[i];
      }
    }
    const float inv = 1.0f / sum;
    // out = sum_j p_j v_j, p_j = e_j / sum, in key order; lanes over d.
    float* out = a.out.row(r) + h * D;
    int64_t d0 = 0;
    for (; d0 + nl <= D; d0 += nl) {
      VF o = hn::Zero(df);
      for (int64_t t = 0; t < len; ++t)
        o = hn::MulAdd(hn::Set(df, scores[t] * inv), hn::LoadU(df, a.v.row(s0 + t) + h * D + d0),
                       o);
      hn::StoreU(o, df, out + d0);
    }
    for (; d0 < D; ++d0) {
      float o = 0.0f;
      for (int64_t t = 0; t < len; ++t)
        o = std::fma(scores[t] * inv, a.v.row(s0 + t)[h * D + d0], o);
      out[d0] = o;
    }
  }
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale::cpu {
HWY_EXPORT(VarlenTransposeKeys);
HWY_EXPORT(VarlenAttentionItems);

void varlen_transpose_keys(const VarlenAttentionArgs& a, float* keys_t, int64_t b, int64_t e) {
  HWY_DYNAMIC_DISPATCH(VarlenTransposeKeys)(a, keys_t, b, e);
}
void varlen_attention_items(const VarlenAttentionArgs& a, const float* keys_t, int64_t b, int64_t e,
                            float* scores) {
  HWY_DYNAMIC_DISPATCH(VarlenAttentionItems)(a, keys_t, b, e, scores);
}
}  // namespace metrale::cpu
#endif
