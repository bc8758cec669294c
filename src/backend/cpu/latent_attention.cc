// Multi-head latent attention in latent space (backend.h LatentAttentionArgs), heads on the
// vector lanes.
//
// All heads of an MLA layer read the same single-"head" cache [latent | rope key], so the
// heads of one row are the natural tile: a work item is one row and up to kLatentHeadGroup of
// its heads, run kN heads at a time (one vector of queries; kN = 16 with AVX-512). With the
// queries on the lanes every step is vertical, no horizontal sums:
//  - scores: for a tile of keys, acc_k += broadcast(key_k[d]) * Q[d] over d = 0, 1, ... in
//    order; Q[d] holds dim d of every head of the chunk (gathered once per chunk), and the
//    key values come from the page's transposed layout ([dim][offset], kv_cache.h);
//  - softmax in two passes over the row's visible keys, per lane: the max of scale * score,
//    p = Exp(s - max) (Highway's vector exp), the sum of p in key order;
//  - P.V: for a tile of latent dims, acc_d += broadcast(latent_k[d]) * P[k] over the keys in
//    order (latent_k[d] for consecutive keys is contiguous in the page), then times 1 / sum.
// Each query's arithmetic depends only on its own lane: not on the head chunk, the other
// rows, the thread split or how a prefill was chunked. The scalar twin is
// reference::latent_attention (two passes, sums in double). A cache of f16 or bf16 is widened
// to f32 exactly as it is read (kv_elements-inl.h).
// Highway re-includes this file once per target: these lines keep their order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/latent_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on
#include <algorithm>
#include <limits>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kv_elements-inl.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(DF()));
static_assert(kN <= kLatentMaxLanes, "scratch is sized for kLatentMaxLanes lanes");
constexpr int kKeyTile = 8;   // keys whose scores accumulate at once
constexpr int kDimTile = 16;  // latent dims whose P.V sums accumulate at once

// s[i * kN + lane] = sum_d q[d * kN + lane] * col[d * ps + i] for KT keys, d in order.
using kv::Widen;

template <int KT, typename T>
HWY_INLINE void KeyScores(const float* HWY_RESTRICT q, const T* col, int64_t ps, int64_t dim,
                          float* HWY_RESTRICT s) {
  const DF df;
  VF acc[KT];
  for (int i = 0; i < KT; ++i) acc[i] = hn::Zero(df);
  for (int64_t d = 0; d < dim; ++d) {
    const VF qd = hn::LoadU(df, q + d * kN);
    const T* c = col + d * ps;
    for (int i = 0; i < KT; ++i) acc[i] = hn::MulAdd(hn::Set(df, Widen(c[i])), qd, acc[i]);
  }
  for (int i = 0; i < KT; ++i) hn::StoreU(acc[i], df, s + i * kN);
}

// acc[i] += p[o * kN + lanes] * col[(d0 + i) * ps + o] for keys o = 0..n-1 in order.
template <int DT, typename T>
HWY_INLINE void DimSums(const float* HWY_RESTRICT p, const T* col, int64_t ps, int64_t n, VF* acc) {
  const DF df;
  for (int64_t o = 0; o < n; ++o) {
    const VF pk = hn::LoadU(df, p + o * kN);
    for (int i = 0; i < DT; ++i)
      acc[i] = hn::MulAdd(hn::Set(df, Widen(col[i * ps + o])), pk, acc[i]);
  }
}

// Latent dims [d0, d0 + DT) of the chunk's outputs: out_lane[d] = inv_lane * sum_k p * c_k[d].
// Keys own..n_keys-1 of a tree verify row are stored at `moved` (backend.h TreeKeys); the
// others (all, for a plain row: own = n_keys) at their own index.
struct RowKeys {
  int64_t n_keys = 0;
  int64_t own = 0;
  const int32_t* moved = nullptr;
};

template <typename T>
const T* KeyColumn(const LatentAttentionArgs& a, const KvPageTable& t, int64_t index) {
  const int64_t ps = a.cache.layout.page_size;
  return a.cache.k_page<T>(t.block_table[static_cast<size_t>(index / ps)], 0) + index % ps;
}

template <int DT, typename T>
HWY_INLINE void OutputTile(const LatentAttentionArgs& a, const KvPageTable& t, const RowKeys& rk,
                           const float* HWY_RESTRICT p, VF inv, int64_t d0, float* const* out,
                           int n_lanes) {
  const DF df;
  const int64_t ps = a.cache.layout.page_size;
  VF acc[DT];
  for (int i = 0; i < DT; ++i) acc[i] = hn::Zero(df);
  for (int64_t first = 0; first < rk.own; first += ps) {
    const T* page = a.cache.k_page<T>(t.block_table[static_cast<size_t>(first / ps)], 0);
    DimSums<DT, T>(p + first * kN, page + d0 * ps, ps, std::min(ps, rk.own - first), acc);
  }
  for (int64_t k = rk.own; k < rk.n_keys; ++k) {  // the same sums, key by key, in key order
    DimSums<DT, T>(p + k * kN, KeyColumn<T>(a, t, rk.moved[k - rk.own]) + d0 * ps, ps, 1, acc);
  }
  HWY_ALIGN float tile[kDimTile * kLatentMaxLanes];
  for (int i = 0; i < DT; ++i) hn::Store(hn::Mul(acc[i], inv), df, tile + i * kN);
  for (int j = 0; j < n_lanes && j < kN; ++j)  // (n_lanes <= kN; the bound tells the compiler)
    for (int i = 0; i < DT; ++i) out[j][d0 + i] = tile[i * kN + j];
}

// Heads [h0, h0 + n_lanes) of row r, n_lanes <= kN. scratch (any alignment): dim * kN floats
// for the queries, then n_keys * kN for the scores.
template <typename T>
void AttendChunk(const LatentAttentionArgs& a, int64_t r, int64_t h0, int n_lanes,
                 float* HWY_RESTRICT scratch) {
  const DF df;
  const KvLayout& kv = a.cache.layout;
  const int64_t dim = kv.head_dim, rank = a.kv_rank, rope = dim - rank, ps = kv.page_size;
  const KvPageTable& t = a.seqs[static_cast<size_t>(a.row_seq[static_cast<size_t>(r)])];
  const int64_t n_keys = a.positions[static_cast<size_t>(r)] + 1;
  RowKeys rk{.n_keys = n_keys, .own = n_keys};
  if (!a.tree.empty()) {
    const TreeKeys& tk = a.tree.rows[static_cast<size_t>(r)];
    rk.own = tk.root + 1;
    rk.moved = a.tree.keys.data() + tk.begin;
  }
  float* q = scratch;
  float* s = scratch + dim * kN;
  // Q[d][lane]: [q_latent | q_rope] of each head; lanes past n_lanes stay 0 (scores 0, unused).
  std::fill(q, q + dim * kN, 0.0f);
  float* out[kLatentMaxLanes];
  for (int j = 0; j < n_lanes; ++j) {
    const int64_t h = h0 + j;
    const float* ql = a.q_latent.row(r) + h * rank;
    const float* qr = a.q.row(r) + h * (a.nope_dim + rope) + a.nope_dim;
    for (int64_t d = 0; d < rank; ++d) q[d * kN + j] = ql[d];
    for (int64_t d = 0; d < rope; ++d) q[(rank + d) * kN + j] = qr[d];
    out[j] = a.out.row(r) + h * rank;
  }
  // Scores, key tile by key tile within each page.
  for (int64_t first = 0; first < rk.own; first += ps) {
    const T* page = a.cache.k_page<T>(t.block_table[static_cast<size_t>(first / ps)], 0);
    const int64_t n = std::min(ps, rk.own - first);
    int64_t o = 0;
    for (; o + kKeyTile <= n; o += kKeyTile)
      KeyScores<kKeyTile, T>(q, page + o, ps, dim, s + (first + o) * kN);
    for (; o + 4 <= n; o += 4) KeyScores<4, T>(q, page + o, ps, dim, s + (first + o) * kN);
    for (; o < n; ++o) KeyScores<1, T>(q, page + o, ps, dim, s + (first + o) * kN);
  }
  for (int64_t k = rk.own; k < n_keys; ++k)
    KeyScores<1, T>(q, KeyColumn<T>(a, t, rk.moved[k - rk.own]), ps, dim, s + k * kN);
  // Softmax per lane: max of the scaled scores, then exp and their sum in key order.
  const VF scale = hn::Set(df, a.scale);
  VF mx = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (int64_t k = 0; k < n_keys; ++k) {
    const VF v = hn::Mul(hn::LoadU(df, s + k * kN), scale);
    hn::StoreU(v, df, s + k * kN);
    mx = hn::Max(mx, v);
  }
  VF sum = hn::Zero(df);
  for (int64_t k = 0; k < n_keys; ++k) {
    const VF p = hn::Exp(df, hn::Sub(hn::LoadU(df, s + k * kN), mx));
    hn::StoreU(p, df, s + k * kN);
    sum = hn::Add(sum, p);
  }
  const VF inv = hn::Div(hn::Set(df, 1.0f), sum);
  int64_t d0 = 0;
  for (; d0 + kDimTile <= rank; d0 += kDimTile)
    OutputTile<kDimTile, T>(a, t, rk, s, inv, d0, out, n_lanes);
  for (; d0 + 4 <= rank; d0 += 4) OutputTile<4, T>(a, t, rk, s, inv, d0, out, n_lanes);
  for (; d0 < rank; ++d0) OutputTile<1, T>(a, t, rk, s, inv, d0, out, n_lanes);
}

template <typename T>
void LatentAttentionItemsOf(const LatentAttentionArgs& a, int64_t item_begin, int64_t item_end,
                            float* scratch) {
  const int64_t groups = (a.n_heads + kLatentHeadGroup - 1) / kLatentHeadGroup;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t r = item / groups;
    const int64_t end = std::min(a.n_heads, (item % groups + 1) * kLatentHeadGroup);
    for (int64_t h0 = item % groups * kLatentHeadGroup; h0 < end; h0 += kN)
      AttendChunk<T>(a, r, h0, static_cast<int>(std::min(kN, end - h0)), scratch);
  }
}

void LatentAttentionItems(const LatentAttentionArgs& a, int64_t item_begin, int64_t item_end,
                          float* scratch) {
  kv::WithElementType(a.cache.layout.dtype, [&](auto e) {
    LatentAttentionItemsOf<decltype(e)>(a, item_begin, item_end, scratch);
  });
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale::cpu {

HWY_EXPORT(LatentAttentionItems);
void latent_attention_items(const LatentAttentionArgs& a, int64_t item_begin, int64_t item_end,
                            float* scratch) {
  HWY_DYNAMIC_DISPATCH(LatentAttentionItems)(a, item_begin, item_end, scratch);
}

}  // namespace metrale::cpu
#endif
