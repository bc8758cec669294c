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
  float* values = keys_t + a.n_heads * D * n;
  const int64_t blocks = (n + kVarlenRowBlock - 1) / kVarlenRowBlock;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t h = item / blocks, r0 = item % blocks * kVarlenRowBlock;
    const int64_t r1 = std::min(n, r0 + kVarlenRowBlock);
    for (int64_t r = r0; r < r1; ++r) {
      const float* k = a.k.row(r) + h * D;
      for (int64_t d = 0; d < D; ++d) keys_t[(h * D + d) * n + r] = k[d];
      std::memcpy(values + (h * n + r) * D, a.v.row(r) + h * D, static_cast<size_t>(D) * 4);
    }
  }
}

// Scores of M queries of one head against a segment's keys: sc[i][j] = scale * sum_d q_i[d] *
// key_j[d], the sum over d in order with one multiply-add per step. The M queries share each
// key load; a query's arithmetic is the same for every M.
template <int M>
HWY_INLINE void TileScores(const float* const* q, const float* kt, int64_t n, int64_t D,
                           int64_t len, float scale, float* const* sc) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const VF vscale = hn::Set(df, scale);
  int64_t j = 0;
  for (; j + 4 * nl <= len; j += 4 * nl) {
    VF c[M][4];
    for (int i = 0; i < M; ++i)
      for (int v = 0; v < 4; ++v) c[i][v] = hn::Zero(df);
    for (int64_t d = 0; d < D; ++d) {
      const float* row = kt + d * n + j;
      VF k[4];
      for (int v = 0; v < 4; ++v) k[v] = hn::LoadU(df, row + v * nl);
      for (int i = 0; i < M; ++i) {
        const VF vq = hn::Set(df, q[i][d]);
        for (int v = 0; v < 4; ++v) c[i][v] = hn::MulAdd(vq, k[v], c[i][v]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int v = 0; v < 4; ++v) hn::StoreU(hn::Mul(c[i][v], vscale), df, sc[i] + j + v * nl);
  }
  for (; j + nl <= len; j += nl) {
    VF c[M];
    for (int i = 0; i < M; ++i) c[i] = hn::Zero(df);
    for (int64_t d = 0; d < D; ++d) {
      const VF k = hn::LoadU(df, kt + d * n + j);
      for (int i = 0; i < M; ++i) c[i] = hn::MulAdd(hn::Set(df, q[i][d]), k, c[i]);
    }
    for (int i = 0; i < M; ++i) hn::StoreU(hn::Mul(c[i], vscale), df, sc[i] + j);
  }
  for (; j < len; ++j) {  // the same fused multiply-adds, one key at a time
    for (int i = 0; i < M; ++i) {
      float c = 0.0f;
      for (int64_t d = 0; d < D; ++d) c = std::fma(q[i][d], kt[d * n + j], c);
      sc[i][j] = c * scale;
    }
  }
}

// Softmax of one query's scores in place: the max, exp(score - max) (zero-padded tail through
// the same vector Exp), the sum (lanes over full vectors, then the tail), all in key order.
// Returns 1 / sum.
HWY_INLINE float SoftmaxInPlace(float* scores, int64_t len) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  float mx = -INFINITY;
  for (int64_t t = 0; t < len; ++t) mx = std::max(mx, scores[t]);
  const VF vmx = hn::Set(df, mx);
  VF acc = hn::Zero(df);
  int64_t j = 0;
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
  return 1.0f / sum;
}

// out_i = sum_t p_i[t] v_t, p_i[t] = e_i[t] * inv_i, in key order, lanes over d, for M queries
// sharing each value row's load (the head's dims of a row are contiguous). Per (query, d) the
// arithmetic is one multiply-add per key, the same for every M.
template <int M>
HWY_INLINE void TileValues(const float* values, int64_t D, int64_t len, const float* const* sc,
                           const float* inv, float* const* out) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  int64_t d0 = 0;
  for (; d0 + 4 * nl <= D; d0 += 4 * nl) {
    VF o[M][4];
    for (int i = 0; i < M; ++i)
      for (int v = 0; v < 4; ++v) o[i][v] = hn::Zero(df);
    for (int64_t t = 0; t < len; ++t) {
      const float* vr = values + t * D + d0;
      VF x[4];
      for (int v = 0; v < 4; ++v) x[v] = hn::LoadU(df, vr + v * nl);
      for (int i = 0; i < M; ++i) {
        const VF p = hn::Set(df, sc[i][t] * inv[i]);
        for (int v = 0; v < 4; ++v) o[i][v] = hn::MulAdd(p, x[v], o[i][v]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int v = 0; v < 4; ++v) hn::StoreU(o[i][v], df, out[i] + d0 + v * nl);
  }
  for (; d0 + nl <= D; d0 += nl) {
    VF o[M];
    for (int i = 0; i < M; ++i) o[i] = hn::Zero(df);
    for (int64_t t = 0; t < len; ++t) {
      const VF x = hn::LoadU(df, values + t * D + d0);
      for (int i = 0; i < M; ++i) o[i] = hn::MulAdd(hn::Set(df, sc[i][t] * inv[i]), x, o[i]);
    }
    for (int i = 0; i < M; ++i) hn::StoreU(o[i], df, out[i] + d0);
  }
  for (; d0 < D; ++d0) {
    for (int i = 0; i < M; ++i) {
      float o = 0.0f;
      for (int64_t t = 0; t < len; ++t) o = std::fma(sc[i][t] * inv[i], values[t * D + d0], o);
      out[i][d0] = o;
    }
  }
}

// Rows r .. r + M - 1 of head h, all in the segment [s0, s0 + len).
template <int M>
void Tile(const VarlenAttentionArgs& a, const float* keys_t, const float* values, int64_t h,
          int64_t r, int64_t s0, int64_t len, float* scores) {
  const int64_t n = a.q.n_rows, D = a.head_dim;
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const float* q[M];
  float* sc[M];
  float* out[M];
  float inv[M];
  for (int i = 0; i < M; ++i) {
    q[i] = a.q.row(r + i) + h * D;
    sc[i] = scores + i * len;
    out[i] = a.out.row(r + i) + h * D;
  }
  TileScores<M>(q, keys_t + h * D * n + s0, n, D, len, scale, sc);
  for (int i = 0; i < M; ++i) inv[i] = SoftmaxInPlace(sc[i], len);
  TileValues<M>(values + (h * n + s0) * D, D, len, sc, inv, out);
}

void VarlenAttentionItems(const VarlenAttentionArgs& a, const float* keys_t, int64_t item_begin,
                          int64_t item_end, float* scores) {
  const int64_t n = a.q.n_rows;
  const float* values = keys_t + a.n_heads * a.head_dim * n;
  const std::span<const int32_t> cu = a.cu_seqlens;
  for (int64_t item = item_begin; item < item_end;) {
    const int64_t h = item / n, r = item % n;
    // The segment holding row r: the last start at or before it.
    const auto seg = std::upper_bound(cu.begin(), cu.end(), static_cast<int32_t>(r)) - 1;
    const int64_t s0 = *seg, s1 = *(seg + 1);
    // A tile: the next rows of this head in this segment and this range.
    const int64_t m = std::min({kVarlenQueries, s1 - r, item_end - item});
    switch (m) {
      case 1:
        Tile<1>(a, keys_t, values, h, r, s0, s1 - s0, scores);
        break;
      case 2:
        Tile<2>(a, keys_t, values, h, r, s0, s1 - s0, scores);
        break;
      case 3:
        Tile<3>(a, keys_t, values, h, r, s0, s1 - s0, scores);
        break;
      default:
        Tile<4>(a, keys_t, values, h, r, s0, s1 - s0, scores);
        break;
    }
    item += m;
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
