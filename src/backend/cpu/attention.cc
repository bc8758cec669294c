// Paged attention (decode and causal prefill) with a blockwise online softmax in f32.
//
// The numerics of one query (a row and a head) are fixed by its position and its
// sequence's cache alone, never by the other rows of the call, how prefill was chunked,
// how queries are tiled, or the thread split:
//  - keys are visited in blocks of kBlock aligned to absolute positions (block b holds
//    keys [b * kBlock, (b + 1) * kBlock)), clipped to the query's window [lo, hi];
//  - score(k) = scale * sum_d q[d] * K[k][d], summed in order d = 0, 1, ... with FMAs;
//  - per block: m' = max(m, block max); if m was finite and moved, l and acc are scaled by
//    exp(m - m'); p = Exp(score - m') (Highway's vector exp); l (one accumulator per
//    vector lane, lane = key % lanes) += p; acc[d] += p * V[k][d] in key order;
//  - out = acc / sum of l's lanes.
// A work item is a tile: up to kMaxQueries queries (rows x the query heads of one GQA
// group) that share one sequence and one kv head, so each K/V element read from the cache
// serves all of them. Scores put keys on vector lanes: the cache stores K transposed
// within each page (kv_cache.h), so a page's keys are contiguous for each (head, dim).
// A cache of f16 or bf16 (KvLayout::dtype) is widened to f32 exactly as it is loaded; the
// arithmetic above is the same for every element type.
// Highway re-includes this file once per target: these lines keep their order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kv_elements-inl.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;

constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(DF()));
constexpr int64_t kVecs = kAttentionBlock / kN;  // vectors per key block
static_assert(kAttentionBlock % kN == 0, "a key block is whole vectors");
// Queries whose scores are accumulated at once: their 2 x kVecs accumulators plus the key
// vectors fit the register file (32 registers with AVX-512, 16 below).
constexpr int kScoreQueries = kN >= 16 ? 8 : 2;
constexpr int kPvQueries = 4;  // queries per P.V register tile (x kPvVecs vectors of dims)
constexpr int64_t kPvVecs = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using kv::LoadWide;
using kv::Widen;

// Where the keys of a tile are stored: key k at index k up to `root`, past it at
// keys[k - root - 1] (backend.h TreeKeys; a tree row's tile is that row alone).
struct KeyIndex {
  int64_t root = std::numeric_limits<int64_t>::max();
  const int32_t* keys = nullptr;
  int64_t operator()(int64_t k) const { return k <= root ? k : keys[k - root - 1]; }
};

struct Query {
  const float* q = nullptr;
  float* out = nullptr;
  int64_t lo = 0, hi = 0;  // keys [lo, hi]
};

// One block's view of the keys for the score kernel: column d of vector v (kN consecutive
// keys) is at col[v] + d * stride.
template <typename T>
struct KeyColumns {
  const T* col[kVecs];
  int64_t stride = 0;
};

// scores[j][i] = scale * sum_d q_j[d] * key_i[d] for NQ queries and one block of keys.
template <int NQ, typename T>
HWY_INLINE void BlockScores(const Query* qs, const KeyColumns<T>& kc, int64_t hd, float scale,
                            float* scores) {
  const DF df;
  VF acc[NQ][kVecs];
  for (int j = 0; j < NQ; ++j)
    for (int64_t v = 0; v < kVecs; ++v) acc[j][v] = hn::Zero(df);
  for (int64_t d = 0; d < hd; ++d) {
    VF k[kVecs];
    for (int64_t v = 0; v < kVecs; ++v) k[v] = LoadWide(df, kc.col[v] + d * kc.stride);
    for (int j = 0; j < NQ; ++j) {
      const VF q = hn::Set(df, qs[j].q[d]);
      for (int64_t v = 0; v < kVecs; ++v) acc[j][v] = hn::MulAdd(q, k[v], acc[j][v]);
    }
  }
  const VF vs = hn::Set(df, scale);
  for (int j = 0; j < NQ; ++j)
    for (int64_t v = 0; v < kVecs; ++v)
      hn::Store(hn::Mul(acc[j][v], vs), df, scores + j * kAttentionBlock + v * kN);
}

template <typename T>
void Scores(const Query* qs, int n, const KeyColumns<T>& kc, int64_t hd, float scale,
            float* scores) {
  for (int j0 = 0; j0 < n; j0 += kScoreQueries) {
    const Query* q = qs + j0;
    float* s = scores + j0 * kAttentionBlock;
    switch (std::min(kScoreQueries, n - j0)) {
      case 1:
        BlockScores<1, T>(q, kc, hd, scale, s);
        break;
      case 2:
        BlockScores<2, T>(q, kc, hd, scale, s);
        break;
      case 3:
        BlockScores<3, T>(q, kc, hd, scale, s);
        break;
      case 4:
        BlockScores<4, T>(q, kc, hd, scale, s);
        break;
      case 5:
        BlockScores<5, T>(q, kc, hd, scale, s);
        break;
      case 6:
        BlockScores<6, T>(q, kc, hd, scale, s);
        break;
      case 7:
        BlockScores<7, T>(q, kc, hd, scale, s);
        break;
      default:
        BlockScores<8, T>(q, kc, hd, scale, s);
        break;
    }
  }
}

// acc_j[d] += p_j[k] * V[k][d] for keys k = 0..n_keys-1 in order, NQ queries at once. The
// arithmetic per (query, d) is the same for every NQ and tiling: one MulAdd per key on the
// vector part of the dims, one scalar multiply-add on the tail past the last whole vector.
template <int NQ, typename T>
HWY_INLINE void BlockPv(float* const* acc, const float* const* p, const T* const* v, int64_t n_keys,
                        int64_t hd) {
  const DF df;
  int64_t d0 = 0;
  for (; d0 + kPvVecs * kN <= hd; d0 += kPvVecs * kN) {
    VF a[NQ][kPvVecs];
    for (int j = 0; j < NQ; ++j)
      for (int64_t i = 0; i < kPvVecs; ++i) a[j][i] = hn::Load(df, acc[j] + d0 + i * kN);
    for (int64_t k = 0; k < n_keys; ++k) {
      VF x[kPvVecs];
      for (int64_t i = 0; i < kPvVecs; ++i) x[i] = LoadWide(df, v[k] + d0 + i * kN);
      for (int j = 0; j < NQ; ++j) {
        const VF pk = hn::Set(df, p[j][k]);
        for (int64_t i = 0; i < kPvVecs; ++i) a[j][i] = hn::MulAdd(pk, x[i], a[j][i]);
      }
    }
    for (int j = 0; j < NQ; ++j)
      for (int64_t i = 0; i < kPvVecs; ++i) hn::Store(a[j][i], df, acc[j] + d0 + i * kN);
  }
  for (; d0 + kN <= hd; d0 += kN) {
    VF a[NQ];
    for (int j = 0; j < NQ; ++j) a[j] = hn::Load(df, acc[j] + d0);
    for (int64_t k = 0; k < n_keys; ++k) {
      const VF x = LoadWide(df, v[k] + d0);
      for (int j = 0; j < NQ; ++j) a[j] = hn::MulAdd(hn::Set(df, p[j][k]), x, a[j]);
    }
    for (int j = 0; j < NQ; ++j) hn::Store(a[j], df, acc[j] + d0);
  }
  for (; d0 < hd; ++d0) {
    for (int j = 0; j < NQ; ++j) {
      float a = acc[j][d0];
      for (int64_t k = 0; k < n_keys; ++k) a += p[j][k] * Widen(v[k][d0]);
      acc[j][d0] = a;
    }
  }
}

template <typename T>
void Pv(float* const* acc, const float* const* p, int n, const T* const* v, int64_t n_keys,
        int64_t hd) {
  for (int j0 = 0; j0 < n; j0 += kPvQueries) {
    switch (std::min(kPvQueries, n - j0)) {
      case 1:
        BlockPv<1, T>(acc + j0, p + j0, v, n_keys, hd);
        break;
      case 2:
        BlockPv<2, T>(acc + j0, p + j0, v, n_keys, hd);
        break;
      case 3:
        BlockPv<3, T>(acc + j0, p + j0, v, n_keys, hd);
        break;
      default:
        BlockPv<4, T>(acc + j0, p + j0, v, n_keys, hd);
        break;
    }
  }
}

// The K columns of keys [b0, b0 + kBlock) of kv head `kvh`, of which [first, last] are
// read (the rest are masked off later). When a page holds whole vectors of keys they are
// read in place; otherwise the keys are gathered into `scratch` ([hd][kBlock]).
// Keys stored away from their own index (`at`: a tree row's ancestors) are gathered too.
template <typename T>
KeyColumns<T> LocateKeys(const AttentionTask& t, const KvPageTable& table, int64_t kvh, int64_t b0,
                         int64_t first, int64_t last, const KeyIndex& at, T* scratch) {
  const KvLayout& kv = t.cache.layout;
  const int64_t hd = kv.head_dim;
  const int64_t ps = kv.page_size;
  KeyColumns<T> kc;
  if (ps % kN == 0 && last <= at.root) {
    kc.stride = ps;
    int64_t live = -1;  // a vector that overlaps [first, last]: stands in for those that do not
    for (int64_t v = 0; v < kVecs; ++v) {
      const int64_t k0 = b0 + v * kN;
      if (k0 + kN - 1 < first || k0 > last) continue;
      const int64_t page = table.block_table[static_cast<size_t>(k0 / ps)];
      kc.col[v] = t.cache.k_page<T>(page, kvh) + k0 % ps;
      live = v;
    }
    for (int64_t v = 0; v < kVecs; ++v) {
      const int64_t k0 = b0 + v * kN;
      if (k0 + kN - 1 < first || k0 > last) kc.col[v] = kc.col[live];
    }
    return kc;
  }
  kc.stride = kAttentionBlock;
  for (int64_t i = 0; i < kAttentionBlock; ++i) {
    const int64_t key = b0 + i;
    if (key < first || key > last) {
      for (int64_t d = 0; d < hd; ++d) std::memset(&scratch[d * kAttentionBlock + i], 0, sizeof(T));
      continue;
    }
    const int64_t index = at(key);
    const int64_t page = table.block_table[static_cast<size_t>(index / ps)];
    const T* col = t.cache.k_page<T>(page, kvh) + index % ps;
    for (int64_t d = 0; d < hd; ++d) scratch[d * kAttentionBlock + i] = col[d * ps];
  }
  for (int64_t v = 0; v < kVecs; ++v) kc.col[v] = scratch + v * kN;
  return kc;
}

// Runs the queries of one tile: all of them read `table`'s cache at kv head `kvh`.
template <typename T>
void AttendTile(const AttentionTask& t, const KvPageTable& table, int64_t kvh, const KeyIndex& at,
                Query* qs, int n) {
  const DF df;
  const DI di;
  const int64_t hd = t.shape.head_dim;
  const int64_t ps = t.cache.layout.page_size;
  HWY_ALIGN float acc[kMaxQueries][kMaxHeadDim];
  HWY_ALIGN float scores[kMaxQueries * kAttentionBlock];
  HWY_ALIGN T key_scratch[kMaxHeadDim * kAttentionBlock];
  float* acc_of[kMaxQueries];
  const float* p_of[kMaxQueries];
  const T* v_rows[kAttentionBlock];
  float m[kMaxQueries];
  VF l[kMaxQueries];
  int64_t lo = qs[0].lo, hi = qs[0].hi;
  for (int j = 0; j < n; ++j) {
    m[j] = kNegInf;
    l[j] = hn::Zero(df);
    std::fill(acc[j], acc[j] + hd, 0.0f);
    lo = std::min(lo, qs[j].lo);
    hi = std::max(hi, qs[j].hi);
  }
  for (int64_t b0 = lo / kAttentionBlock * kAttentionBlock; b0 <= hi; b0 += kAttentionBlock) {
    const int64_t first = std::max(lo, b0);
    const int64_t last = std::min(hi, b0 + kAttentionBlock - 1);
    Scores(qs, n, LocateKeys(t, table, kvh, b0, first, last, at, key_scratch), hd, t.shape.scale,
           scores);
    for (int64_t k = first; k <= last; ++k) {
      v_rows[k - first] = t.cache.v_row<T>(table.slot(at(k), ps)) + kvh * hd;
    }
    // Online-softmax update of each query that has keys in this block.
    int n_active = 0;
    for (int j = 0; j < n; ++j) {
      const int64_t a = std::max(qs[j].lo, b0) - b0;
      const int64_t b = std::min(qs[j].hi, b0 + kAttentionBlock - 1) - b0;
      if (a > b) continue;
      float* s = scores + j * kAttentionBlock;
      VF sv[kVecs];
      VF block_max = hn::Set(df, kNegInf);
      for (int64_t v = 0; v < kVecs; ++v) {
        const auto key = hn::Iota(di, static_cast<int32_t>(v * kN));
        const auto in = hn::And(hn::Gt(key, hn::Set(di, static_cast<int32_t>(a - 1))),
                                hn::Lt(key, hn::Set(di, static_cast<int32_t>(b + 1))));
        sv[v] =
            hn::IfThenElse(hn::RebindMask(df, in), hn::Load(df, s + v * kN), hn::Set(df, kNegInf));
        block_max = hn::Max(block_max, sv[v]);
      }
      const float m_new = std::max(m[j], hn::GetLane(hn::MaxOfLanes(df, block_max)));
      if (m[j] != kNegInf && m[j] != m_new) {
        const float c = std::exp(m[j] - m_new);
        const VF vc = hn::Set(df, c);
        l[j] = hn::Mul(l[j], vc);
        int64_t d = 0;
        for (; d + kN <= hd; d += kN)
          hn::Store(hn::Mul(hn::Load(df, acc[j] + d), vc), df, acc[j] + d);
        for (; d < hd; ++d) acc[j][d] *= c;
      }
      m[j] = m_new;
      const VF vm = hn::Set(df, m_new);
      for (int64_t v = 0; v < kVecs; ++v) {
        const VF pv = hn::Exp(df, hn::Sub(sv[v], vm));  // masked lanes: Exp(-inf) = 0
        l[j] = hn::Add(l[j], pv);
        hn::Store(pv, df, s + v * kN);
      }
      acc_of[n_active] = acc[j];
      p_of[n_active] = s + (first - b0);
      ++n_active;
    }
    // Every active query over all the tile's keys [first, last], sharing each V read, even
    // where queries see different keys (the diagonal block of a prefill tile, a window edge):
    // a key outside a query's range has p = Exp(-inf) = +0 exactly, and acc + 0 * V[k] is acc,
    // bit for bit (acc starts at +0 and a sum of products with p >= 0 is never -0; V of a key
    // the cache holds is finite: an inf or NaN there makes every later query's output NaN
    // anyway), so each query's result is the one its own keys give.
    Pv(acc_of, p_of, n_active, v_rows, last - first + 1, hd);
  }
  for (int j = 0; j < n; ++j) {
    const float inv = 1.0f / hn::GetLane(hn::SumOfLanes(df, l[j]));
    for (int64_t d = 0; d < hd; ++d) qs[j].out[d] = acc[j][d] * inv;
  }
}

template <typename T>
void AttentionItemsOf(const AttentionTask& t, const AttentionPlan& plan, int64_t item_begin,
                      int64_t item_end) {
  const AttentionShape& sh = t.shape;
  const int64_t hd = sh.head_dim;
  const int64_t group = sh.n_heads / sh.n_kv_heads;
  Query qs[kMaxQueries];
  for (int64_t item = item_begin; item < item_end; ++item) {
    const AttentionPlan::Tile tile = plan.tile(item);
    const KvPageTable& table = t.table(tile.row_begin);
    int n = 0;
    for (int64_t row = tile.row_begin; row < tile.row_end; ++row) {
      const int64_t pos = t.position(row);
      const int64_t lo =
          sh.sliding_window > 0 ? std::max<int64_t>(0, pos - sh.sliding_window + 1) : 0;
      for (int64_t h = tile.head_begin; h < tile.head_end; ++h) {
        const int64_t col = (tile.kv_head * group + h) * hd;
        qs[n++] = {.q = t.q.row(row) + col, .out = t.out.row(row) + col, .lo = lo, .hi = pos};
      }
    }
    KeyIndex at;
    if (t.remapped(tile.row_begin)) {
      const TreeKeys& tk = t.tree[tile.row_begin];
      at = {.root = tk.root, .keys = t.tree_keys + tk.begin};
    }
    AttendTile<T>(t, table, tile.kv_head, at, qs, n);
  }
}

void AttentionItems(const AttentionTask& t, const AttentionPlan& plan, int64_t item_begin,
                    int64_t item_end) {
  kv::WithElementType(t.cache.layout.dtype, [&](auto e) {
    AttentionItemsOf<decltype(e)>(t, plan, item_begin, item_end);
  });
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale::cpu {

AttentionTask attention_task(const AttentionArgs& a) {
  AttentionTask task{.q = a.q,
                     .out = a.out,
                     .cache = a.cache,
                     .tables = a.seqs.data(),
                     .row_seq = a.row_seq.data(),
                     .positions = a.positions.data(),
                     .shape = a.shape};
  if (!a.tree.empty()) {
    task.tree = a.tree.rows.data();
    task.tree_keys = a.tree.keys.data();
  }
  if (task.shape.scale == 0.0f)
    task.shape.scale = 1.0f / std::sqrt(static_cast<float>(a.shape.head_dim));
  return task;
}

AttentionPlan plan_attention(const AttentionShape& shape) {
  AttentionPlan p;
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  p.heads_per_pass = std::min<int64_t>(group, kMaxQueries);
  p.n_passes = (group + p.heads_per_pass - 1) / p.heads_per_pass;
  p.group = group;
  p.n_kv_heads = shape.n_kv_heads;
  p.rows_per_tile = std::max<int64_t>(1, kMaxQueries / p.heads_per_pass);
  return p;
}

int64_t attention_row_spans(const AttentionTask& t, int64_t rows_per_tile, AttentionRowSpan* out) {
  int64_t n = 0;
  for (int64_t r = 0; r < t.q.n_rows;) {
    int64_t e = r + 1;
    while (e < t.q.n_rows && e - r < rows_per_tile && t.row_seq[e] == t.row_seq[r] &&
           !t.remapped(r) && !t.remapped(e)) {
      ++e;
    }
    out[n++] = {r, e};
    r = e;
  }
  return n;
}

AttentionPlan::Tile AttentionPlan::tile(int64_t item) const {
  Tile tl;
  const int64_t per_head = n_passes * n_spans;
  tl.kv_head = item / per_head;
  const int64_t pass = item % per_head / n_spans;
  const int64_t z = item % n_spans;
  const AttentionRowSpan& s = spans[z % 2 == 0 ? z / 2 : n_spans - 1 - z / 2];
  tl.row_begin = s.row_begin;
  tl.row_end = s.row_end;
  tl.head_begin = pass * heads_per_pass;
  tl.head_end = std::min(group, tl.head_begin + heads_per_pass);
  return tl;
}

HWY_EXPORT(AttentionItems);
void attention_items(const AttentionTask& t, const AttentionPlan& plan, int64_t item_begin,
                     int64_t item_end) {
  HWY_DYNAMIC_DISPATCH(AttentionItems)(t, plan, item_begin, item_end);
}

}  // namespace metrale::cpu
#endif
