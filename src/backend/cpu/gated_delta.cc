// Gated DeltaNet kernels: the depthwise causal conv, the gated delta rule and sigmoid_mul.
//
// Causal conv (one task = the rows of one sequence x a block of channels): the block's
// starting state is copied to a scratch window first (an out block may be the in block), then
// row i's channel c is act(sum_j w[j][c] * u[i + j][c]) over the stream u = [state rows,
// x rows], summed j = 0, 1, ... (the first a product, then FMAs), and the K - 1 stream rows
// ending at row i go to out[i] when it is set. Later rows then read those rows as stored (f16
// storage: rounded), so keeping every state equals one-row calls chained, as for the rule.
//
// Delta rule (one task = the rows of one sequence x one value head; the state's value
// columns evolve independently, so a task walks its columns in tiles of a few vectors and
// runs all its rows over one tile while that tile of S sits in L1). Per row, in f32:
//   qn = (q * 1/sqrt(|q|^2 + 1e-6)) * 1/sqrt(Dk),  kn = k * 1/sqrt(|k|^2 + 1e-6)
//   g = -exp(a_log) * softplus(a + dt_bias) (torch's softplus: x past 20 is x),
//   decay = exp(g),  beta = 1 / (1 + exp(-b))  (std:: functions, scalars)
//   kv = S^T kn, sq = S^T qn                  (sums over Dk in order, FMAs, from zero)
//   delta = (v - decay kv) beta
//   out = decay sq + (kn . qn) delta          (= S'^T qn)
//   S' = decay S + kn delta^T                 (one multiply, one FMA per element)
// The sums kv, sq of the next row are taken from S' in the same pass that writes it. When
// the state is stored as f16, a kept state (out[i] set) is rounded and the next row continues
// from the rounded values, so a run with every state kept equals one-row calls chained.
//
// The chunked form (runs of more than kDeltaChunkMinRows rows keeping only the last state)
// is HF's torch_chunk_gated_delta_rule on chunks of kDeltaChunk rows, with the unit lower
// triangular system solved by forward substitution; every product is a small GEMM whose
// per-element sum runs over k in order (FMAs), so its results too are fixed by the run alone.
// Highway re-includes this file once per target: these lines keep their order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/gated_delta.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "backend/cpu/activation-inl.h"
// clang-format on
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/gated_delta.h"
#include "core/dtype.h"
#include "hwy/cache_control.h"

// Target-independent parts: once, although Highway includes this file once per target.
#ifndef METRALE_BACKEND_CPU_GATED_DELTA_SHARED_
#define METRALE_BACKEND_CPU_GATED_DELTA_SHARED_
namespace metrale::cpu {
namespace {

constexpr size_t kAlignFloats = 16;  // 64 bytes
inline size_t round_floats(size_t n) {
  return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

// Per-row scalars of one value head.
struct RowScalars {
  float g = 0, decay = 0, beta = 0, kq = 0;
};

// Scratch layout of one delta_rule_head call (floats, each part 64-byte aligned).
struct RecurrentLayout {
  size_t s = 0, kn = 0, qn = 0, scalars = 0, total = 0;
  RecurrentLayout(int64_t dk, int64_t dv) {
    const auto k = static_cast<size_t>(dk), v = static_cast<size_t>(dv);
    const auto rb = static_cast<size_t>(kDeltaRowBlock);
    kn = round_floats(k * v);
    qn = kn + round_floats(rb * k);
    scalars = qn + round_floats(rb * k);
    total = scalars + round_floats(rb * sizeof(RowScalars) / sizeof(float));
  }
};

struct ChunkedLayout {
  size_t s = 0, kn = 0, qn = 0, kt = 0, g = 0, p = 0, x = 0, gc = 0, beta = 0, eg = 0, egl = 0,
         total = 0;
  ChunkedLayout(int64_t dk, int64_t dv) {
    const auto k = static_cast<size_t>(dk), v = static_cast<size_t>(dv);
    const auto l = static_cast<size_t>(kDeltaChunk);
    kn = round_floats(k * v);
    qn = kn + round_floats(l * k);
    kt = qn + round_floats(l * k);
    g = kt + round_floats(k * l);
    p = g + round_floats(l * l);
    x = p + round_floats(l * l);
    gc = x + round_floats(l * (v + k));
    beta = gc + round_floats(l);
    eg = beta + round_floats(l);
    egl = eg + round_floats(l);
    total = egl + round_floats(l);
  }
};

}  // namespace
}  // namespace metrale::cpu
#endif  // METRALE_BACKEND_CPU_GATED_DELTA_SHARED_

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DH = hn::Rebind<hwy::float16_t, DF>;

constexpr int64_t kMaxLanes = 64 / sizeof(float);
// Targets converting f16 in hardware (F16C): Highway's emulation on older targets truncates,
// so those convert lane by lane with core/dtype's round-to-nearest-even.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
constexpr bool kHardwareF16 = true;
#else
constexpr bool kHardwareF16 = false;
#endif
// Vectors per register tile: AVX-512 has 32 registers, narrower x86 targets 16.
constexpr int kTileVecs = HWY_MAX_BYTES >= 64 ? 4 : 2;
// Vectors of value columns the recurrent form carries per tile (its kv, sq and delta: 24
// registers at 8). With AVX-512 a tile is a whole 128-column state row: decode streams the
// state sequentially, 1.8x faster than 64-column tiles on Zen 4.
constexpr int kRecVecs = HWY_MAX_BYTES >= 64 ? 8 : 2;

// The loops over a register tile's vectors must unroll, or the tile lives in memory.
#define METRALE_UNROLL _Pragma("GCC unroll 16")

HWY_INLINE int64_t Lanes() { return static_cast<int64_t>(hn::Lanes(DF())); }

// Up to one vector of a row, zero past `n` lanes; and its store.
HWY_INLINE VF LoadPart(DF df, const float* p, int64_t n) {
  HWY_ALIGN float t[kMaxLanes] = {};
  std::memcpy(t, p, static_cast<size_t>(n) * sizeof(float));
  return hn::Load(df, t);
}
HWY_INLINE void StorePart(DF df, VF v, float* p, int64_t n) {
  HWY_ALIGN float t[kMaxLanes];
  hn::Store(v, df, t);
  std::memcpy(p, t, static_cast<size_t>(n) * sizeof(float));
}

// ---- state storage (f32 or f16) ----

void LoadState(const std::byte* p, DType dt, int64_t n, float* dst) {
  if (dt == DType::kF32) {
    std::memcpy(dst, p, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  int64_t i = 0;
  if constexpr (kHardwareF16) {
    const DF df;
    const DH dh;
    const int64_t nl = Lanes();
    for (; i + nl <= n; i += nl)
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(h + i))),
                 df, dst + i);
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}

void StoreState(const float* src, int64_t n, DType dt, std::byte* p) {
  if (dt == DType::kF32) {
    std::memcpy(p, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(p);
  int64_t i = 0;
  if constexpr (kHardwareF16) {
    const DF df;
    const DH dh;
    const int64_t nl = Lanes();
    for (; i + nl <= n; i += nl)
      hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh,
                 reinterpret_cast<hwy::float16_t*>(h + i));
  }
  for (; i < n; ++i) h[i] = f32_to_f16(src[i]);
}

// Stores v as f16 at p and returns the stored values widened back.
HWY_INLINE VF StoreF16(DF df, VF v, uint16_t* p) {
  if constexpr (kHardwareF16) {
    const DH dh;
    const auto h = hn::DemoteTo(dh, v);
    hn::StoreU(h, dh, reinterpret_cast<hwy::float16_t*>(p));
    return hn::PromoteTo(df, h);
  } else {
    HWY_ALIGN float t[kMaxLanes];
    hn::Store(v, df, t);
    for (int64_t i = 0; i < Lanes(); ++i) {
      p[i] = f32_to_f16(t[i]);
      t[i] = f16_to_f32(p[i]);
    }
    return hn::Load(df, t);
  }
}

// ---- causal conv ----

void CausalConvBlock(const CausalConvArgs& a, const StateSpan& span, int64_t c0, int64_t c1,
                     float* window) {
  const DF df;
  const int64_t nl = Lanes();
  const int64_t C = a.x.n_cols, K = a.kernel, w = c1 - c0, n = span.n_rows();
  const StateRun& run = *span.run;
  const DType dt = a.state.dtype;
  const size_t esz = dt == DType::kF32 ? sizeof(float) : sizeof(uint16_t);
  auto state_row = [&](int64_t j) {
    return a.state.offset + static_cast<size_t>(j * C + c0) * esz;
  };
  // The last K - 1 inputs, a ring whose oldest row is at `oldest`: first the block's starting
  // state, read before any out block (which may be `in`) is written.
  for (int64_t j = 0; j + 1 < K; ++j) LoadState(run.in + state_row(j), dt, w, window + j * w);
  int64_t oldest = 0;
  for (int64_t i = 0; i < n; ++i) {
    // A tree row continues from its parent's kept inputs (stored, so as a chain reads them).
    if (!run.parent.empty() && run.parent[static_cast<size_t>(i)] != i - 1) {
      const int32_t p = run.parent[static_cast<size_t>(i)];
      const std::byte* from = p < 0 ? run.in : run.out[static_cast<size_t>(p)];
      for (int64_t j = 0; j + 1 < K; ++j) LoadState(from + state_row(j), dt, w, window + j * w);
      oldest = 0;
    }
    const float* x = a.x.row(span.row_begin + i) + c0;
    float* y = a.out.row(span.row_begin + i) + c0;
    if (i + 1 < n) {  // the next row is a page or more away: no hardware prefetch reaches it
      const float* next = a.x.row(span.row_begin + i + 1) + c0;
      for (int64_t c = 0; c < w; c += 64 / sizeof(float)) hwy::Prefetch(next + c);
    }
    for (int64_t c = 0; c < w; c += nl) {
      const int64_t m = std::min(nl, w - c);
      VF acc = hn::Zero(df);
      int64_t slot = oldest;
      for (int64_t j = 0; j < K; ++j) {
        const float* wj = a.weight + j * C + c0 + c;
        const float* u = (j + 1 < K ? window + slot * w : x) + c;
        slot = slot + 2 == K ? 0 : slot + 1;
        const VF wv = m == nl ? hn::LoadU(df, wj) : LoadPart(df, wj, m);
        const VF uv = m == nl ? hn::LoadU(df, u) : LoadPart(df, u, m);
        acc = j == 0 ? hn::Mul(wv, uv) : hn::MulAdd(wv, uv, acc);
      }
      if (a.silu) acc = Silu(df, acc);
      if (m == nl) {
        hn::StoreU(acc, df, y + c);
      } else {
        StorePart(df, acc, y + c, m);
      }
    }
    std::memcpy(window + oldest * w, x, static_cast<size_t>(w) * sizeof(float));
    oldest = (oldest + 1) % (K - 1);
    std::byte* dst = run.out[static_cast<size_t>(i)];
    if (dst == nullptr) continue;
    // Kept: later rows continue from the stored (for f16, rounded) values.
    for (int64_t j = 0; j + 1 < K; ++j) {
      float* row = window + (oldest + j) % (K - 1) * w;
      std::byte* to = dst + state_row(j);
      StoreState(row, w, dt, to);
      if (dt != DType::kF32) LoadState(to, dt, w, row);
    }
  }
}

// ---- delta rule: shared pieces ----

// sum x[i] y[i] in a fixed order: vector lanes over full vectors, then the scalar tail.
float Dot(const float* x, const float* y, int64_t n) {
  const DF df;
  const int64_t nl = Lanes();
  VF acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) acc = hn::MulAdd(hn::LoadU(df, x + i), hn::LoadU(df, y + i), acc);
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

// The normalised q and k of row r for value head h, and the row's scalars.
void PrepareRow(const DeltaRuleArgs& a, int64_t r, int64_t h, float* qn, float* kn, RowScalars* p) {
  const int64_t dk = a.k_head_dim;
  const int64_t kh = h / (a.n_v_heads / a.n_k_heads);
  const float* q = a.q.row(r) + kh * dk;
  const float* k = a.k.row(r) + kh * dk;
  const float q_inv = 1.0f / std::sqrt(Dot(q, q, dk) + 1e-6f);
  const float k_inv = 1.0f / std::sqrt(Dot(k, k, dk) + 1e-6f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t d = 0; d < dk; ++d) {
    qn[d] = (q[d] * q_inv) * scale;
    kn[d] = k[d] * k_inv;
  }
  p->kq = Dot(kn, qn, dk);
  const float x = a.a.row(r)[h] + a.dt_bias[h];
  const float softplus = x > 20.0f ? x : std::log1p(std::exp(x));
  p->g = -std::exp(a.a_log[h]) * softplus;
  p->decay = std::exp(p->g);
  p->beta = 1.0f / (1.0f + std::exp(-a.b.row(r)[h]));
}

// ---- delta rule: the recurrent form ----

// One row block of a head task: rows [t0, t0 + n) of the span, their prepared inputs, and
// per row the state it reads, the state it writes (may be the same) and the f16 block that
// keeps it (null: none, or f32 storage).
struct RowBlock {
  const DeltaRuleArgs* a = nullptr;
  int64_t row0 = 0;  // the block's first row in the call
  int64_t n = 0;
  int64_t h = 0;
  const float* kn = nullptr;  // [n][dk]
  const float* qn = nullptr;
  const RowScalars* sc = nullptr;
  const float* const* src = nullptr;
  float* const* dst = nullptr;
  uint16_t* const* keep16 = nullptr;
};

// S' = decay S + kn delta^T over one tile's columns, written to dst (and f16); with kNext,
// also the next row's kv and sq from S'.
template <int NV, bool kNext, bool kF16>
HWY_INLINE void UpdateTile(int64_t dk, int64_t dv, const float* src, float* dst, uint16_t* f16,
                           const float* kn, const float* kn_next, const float* qn_next, float decay,
                           const VF* delta, VF* kv, VF* sq) {
  const DF df;
  const int64_t nl = Lanes();
  const VF vd = hn::Set(df, decay);
  for (int64_t d = 0; d < dk; ++d) {
    const VF kd = hn::Set(df, kn[d]);
    const float* s = src + d * dv;
    float* o = dst + d * dv;
    METRALE_UNROLL
    for (int v = 0; v < NV; ++v) {
      VF x = hn::MulAdd(kd, delta[v], hn::Mul(vd, hn::LoadU(df, s + v * nl)));
      if constexpr (kF16) x = StoreF16(df, x, f16 + d * dv + v * nl);
      hn::StoreU(x, df, o + v * nl);
      if constexpr (kNext) {
        kv[v] = hn::MulAdd(hn::Set(df, kn_next[d]), x, kv[v]);
        sq[v] = hn::MulAdd(hn::Set(df, qn_next[d]), x, sq[v]);
      }
    }
  }
}

// Columns [c, c + NV lanes) of the head over every row of the block.
template <int NV>
void RecurrentTile(const RowBlock& b, int64_t c) {
  const DF df;
  const int64_t nl = Lanes();
  const DeltaRuleArgs& a = *b.a;
  const int64_t dk = a.k_head_dim, dv = a.v_head_dim;
  VF kv[NV], sq[NV], delta[NV];
  METRALE_UNROLL
  for (int v = 0; v < NV; ++v) kv[v] = sq[v] = hn::Zero(df);
  {
    const float* s = b.src[0] + c;
    for (int64_t d = 0; d < dk; ++d) {
      const VF kd = hn::Set(df, b.kn[d]), qd = hn::Set(df, b.qn[d]);
      METRALE_UNROLL
      for (int v = 0; v < NV; ++v) {
        const VF x = hn::LoadU(df, s + d * dv + v * nl);
        kv[v] = hn::MulAdd(kd, x, kv[v]);
        sq[v] = hn::MulAdd(qd, x, sq[v]);
      }
    }
  }
  for (int64_t i = 0; i < b.n; ++i) {
    const RowScalars& p = b.sc[i];
    const int64_t r = b.row0 + i;
    const float* vin = a.v.row(r) + b.h * dv + c;
    float* out = a.out.row(r) + b.h * dv + c;
    const VF vd = hn::Set(df, p.decay), vb = hn::Set(df, p.beta), vkq = hn::Set(df, p.kq);
    METRALE_UNROLL
    for (int v = 0; v < NV; ++v) {
      delta[v] = hn::Mul(hn::Sub(hn::LoadU(df, vin + v * nl), hn::Mul(vd, kv[v])), vb);
      hn::StoreU(hn::MulAdd(vkq, delta[v], hn::Mul(vd, sq[v])), df, out + v * nl);
      kv[v] = sq[v] = hn::Zero(df);
    }
    const float* src = b.src[i] + c;
    float* dst = b.dst[i] + c;
    uint16_t* f16 = b.keep16[i] != nullptr ? b.keep16[i] + c : nullptr;
    const float* kn = b.kn + i * dk;
    if (i + 1 < b.n) {
      const float* kn_next = kn + dk;
      const float* qn_next = b.qn + (i + 1) * dk;
      if (f16 != nullptr) {
        UpdateTile<NV, true, true>(dk, dv, src, dst, f16, kn, kn_next, qn_next, p.decay, delta, kv,
                                   sq);
      } else {
        UpdateTile<NV, true, false>(dk, dv, src, dst, f16, kn, kn_next, qn_next, p.decay, delta, kv,
                                    sq);
      }
    } else if (f16 != nullptr) {
      UpdateTile<NV, false, true>(dk, dv, src, dst, f16, kn, nullptr, nullptr, p.decay, delta, kv,
                                  sq);
    } else {
      UpdateTile<NV, false, false>(dk, dv, src, dst, f16, kn, nullptr, nullptr, p.decay, delta, kv,
                                   sq);
    }
  }
}

// Column c alone (the columns past the last whole vector): the same steps in scalars.
void RecurrentColumn(const RowBlock& b, int64_t c) {
  const DeltaRuleArgs& a = *b.a;
  const int64_t dk = a.k_head_dim, dv = a.v_head_dim;
  float kv = 0.0f, sq = 0.0f;
  for (int64_t d = 0; d < dk; ++d) {
    const float x = b.src[0][d * dv + c];
    kv = std::fma(b.kn[d], x, kv);
    sq = std::fma(b.qn[d], x, sq);
  }
  for (int64_t i = 0; i < b.n; ++i) {
    const RowScalars& p = b.sc[i];
    const int64_t r = b.row0 + i;
    const float delta = (a.v.row(r)[b.h * dv + c] - p.decay * kv) * p.beta;
    a.out.row(r)[b.h * dv + c] = std::fma(p.kq, delta, p.decay * sq);
    const bool next = i + 1 < b.n;
    const float* kn = b.kn + i * dk;
    kv = sq = 0.0f;
    for (int64_t d = 0; d < dk; ++d) {
      float x = std::fma(kn[d], delta, p.decay * b.src[i][d * dv + c]);
      if (b.keep16[i] != nullptr) {
        b.keep16[i][d * dv + c] = f32_to_f16(x);
        x = f16_to_f32(b.keep16[i][d * dv + c]);
      }
      b.dst[i][d * dv + c] = x;
      if (next) {
        kv = std::fma(kn[dk + d], x, kv);
        sq = std::fma(b.qn[(i + 1) * dk + d], x, sq);
      }
    }
  }
}

void DeltaRuleHeadRecurrent(const DeltaRuleArgs& a, const StateSpan& span, int64_t h,
                            float* scratch) {
  const int64_t dk = a.k_head_dim, dv = a.v_head_dim, n = span.n_rows();
  const int64_t nl = Lanes();
  const RecurrentLayout lay(dk, dv);
  float* s_scr = scratch + lay.s;
  float* kn = scratch + lay.kn;
  float* qn = scratch + lay.qn;
  auto* sc = reinterpret_cast<RowScalars*>(scratch + lay.scalars);
  const StateRun& run = *span.run;
  const bool f16 = a.state.dtype == DType::kF16;
  const size_t head = static_cast<size_t>(h * dk * dv);
  const size_t off = a.state.offset;
  // f32 storage: rows read their state where it lies (in, or the previous kept block) and
  // write it to their out block, or to scratch when it is not kept. f16: the state lives in
  // scratch (widened from in once) and kept states are copied out rounded.
  const float* cur = nullptr;
  if (f16) {
    LoadState(run.in + off + head * sizeof(uint16_t), DType::kF16, dk * dv, s_scr);
    cur = s_scr;
  } else {
    cur = reinterpret_cast<const float*>(run.in + off) + head;
  }
  const float* src[kDeltaRowBlock];
  float* dst[kDeltaRowBlock];
  uint16_t* keep16[kDeltaRowBlock];
  // A tree row continues from its parent's kept state (stored, so as a chain reads it); a
  // block of rows is a chain (its kv / sq sums for the next row come from this row's S'), so a
  // block ends before a row whose parent is not the row before it.
  const auto chained = [&](int64_t t) {
    return run.parent.empty() || run.parent[static_cast<size_t>(t)] == t - 1;
  };
  for (int64_t t0 = 0, nb = 0; t0 < n; t0 += nb) {
    nb = 1;
    while (nb < kDeltaRowBlock && t0 + nb < n && chained(t0 + nb)) ++nb;
    if (!chained(t0)) {
      const int32_t p = run.parent[static_cast<size_t>(t0)];
      const std::byte* from = p < 0 ? run.in : run.out[static_cast<size_t>(p)];
      if (f16) {
        LoadState(from + off + head * sizeof(uint16_t), DType::kF16, dk * dv, s_scr);
        cur = s_scr;
      } else {
        cur = reinterpret_cast<const float*>(from + off) + head;
      }
    }
    for (int64_t i = 0; i < nb; ++i) {
      PrepareRow(a, span.row_begin + t0 + i, h, qn + i * dk, kn + i * dk, &sc[i]);
      std::byte* o = run.out[static_cast<size_t>(t0 + i)];
      src[i] = cur;
      if (f16) {
        dst[i] = s_scr;
        keep16[i] = o != nullptr ? reinterpret_cast<uint16_t*>(o + off) + head : nullptr;
      } else {
        dst[i] = o != nullptr ? reinterpret_cast<float*>(o + off) + head : s_scr;
        keep16[i] = nullptr;
      }
      cur = dst[i];
    }
    const RowBlock b{.a = &a,
                     .row0 = span.row_begin + t0,
                     .n = nb,
                     .h = h,
                     .kn = kn,
                     .qn = qn,
                     .sc = sc,
                     .src = src,
                     .dst = dst,
                     .keep16 = keep16};
    int64_t c = 0;
    for (; c + kRecVecs * nl <= dv; c += kRecVecs * nl) RecurrentTile<kRecVecs>(b, c);
    for (; c + nl <= dv; c += nl) RecurrentTile<1>(b, c);
    for (; c < dv; ++c) RecurrentColumn(b, c);
  }
}

// ---- delta rule: the chunked form ----

// C[M x N] (=, or +=, or -= with kSub) A[M x K] B[K x N]; each element's sum starts from C
// (or zero) and runs over k in order with one FMA per k, whatever the tiling.
template <int MR, int NV, bool kSub>
HWY_INLINE void GemmTile(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                         float* C, int64_t ldc, bool zero) {
  const DF df;
  const int64_t nl = Lanes();
  VF acc[MR][NV];
  METRALE_UNROLL
  for (int m = 0; m < MR; ++m) METRALE_UNROLL
  for (int v = 0; v < NV; ++v)
    acc[m][v] = zero ? hn::Zero(df) : hn::LoadU(df, C + m * ldc + v * nl);
  for (int64_t k = 0; k < K; ++k) {
    VF bv[NV];
    METRALE_UNROLL
    for (int v = 0; v < NV; ++v) bv[v] = hn::LoadU(df, B + k * ldb + v * nl);
    METRALE_UNROLL
    for (int m = 0; m < MR; ++m) {
      const VF am = hn::Set(df, A[m * lda + k]);
      METRALE_UNROLL
      for (int v = 0; v < NV; ++v)
        acc[m][v] = kSub ? hn::NegMulAdd(am, bv[v], acc[m][v]) : hn::MulAdd(am, bv[v], acc[m][v]);
    }
  }
  METRALE_UNROLL
  for (int m = 0; m < MR; ++m) METRALE_UNROLL
  for (int v = 0; v < NV; ++v) hn::StoreU(acc[m][v], df, C + m * ldc + v * nl);
}

template <int NV, bool kSub>
HWY_INLINE void GemmColumns(int64_t M, int64_t K, const float* A, int64_t lda, const float* B,
                            int64_t ldb, float* C, int64_t ldc, bool zero) {
  constexpr int kMR = 4;
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR)
    GemmTile<kMR, NV, kSub>(K, A + m * lda, lda, B, ldb, C + m * ldc, ldc, zero);
  for (; m < M; ++m) GemmTile<1, NV, kSub>(K, A + m * lda, lda, B, ldb, C + m * ldc, ldc, zero);
}

template <bool kSub>
void Gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          float* C, int64_t ldc, bool zero) {
  const int64_t nl = Lanes();
  int64_t n = 0;
  for (; n + kTileVecs * nl <= N; n += kTileVecs * nl)
    GemmColumns<kTileVecs, kSub>(M, K, A, lda, B + n, ldb, C + n, ldc, zero);
  for (; n + nl <= N; n += nl) GemmColumns<1, kSub>(M, K, A, lda, B + n, ldb, C + n, ldc, zero);
  for (; n < N; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      float acc = zero ? 0.0f : C[m * ldc + n];
      for (int64_t k = 0; k < K; ++k)
        acc = std::fma(kSub ? -A[m * lda + k] : A[m * lda + k], B[k * ldb + n], acc);
      C[m * ldc + n] = acc;
    }
  }
}

void DeltaRuleHeadChunked(const DeltaRuleArgs& a, const StateSpan& span, int64_t h,
                          float* scratch) {
  constexpr int64_t kTri = 16;  // rows per block of the triangular products
  const DF df;
  const int64_t nl = Lanes();
  const int64_t dk = a.k_head_dim, dv = a.v_head_dim, n = span.n_rows();
  const ChunkedLayout lay(dk, dv);
  float* S = scratch + lay.s;  // [dk][dv]
  float* kn = scratch + lay.kn;
  float* qn = scratch + lay.qn;
  float* kt = scratch + lay.kt;  // [dk][m]
  float* G = scratch + lay.g;    // [m][m]
  float* P = scratch + lay.p;    // [m][m]
  float* X = scratch + lay.x;    // [m][dv + dk]: U | W, then v_new | W
  float* gc = scratch + lay.gc;
  float* beta = scratch + lay.beta;
  float* eg = scratch + lay.eg;
  float* egl = scratch + lay.egl;
  const int64_t ldx = dv + dk;
  const StateRun& run = *span.run;
  const size_t esz = a.state.dtype == DType::kF32 ? sizeof(float) : sizeof(uint16_t);
  const size_t head_bytes = static_cast<size_t>(h * dk * dv) * esz;
  LoadState(run.in + a.state.offset + head_bytes, a.state.dtype, dk * dv, S);
  for (int64_t t0 = 0; t0 < n; t0 += kDeltaChunk) {
    const int64_t m = std::min(kDeltaChunk, n - t0);
    const int64_t row0 = span.row_begin + t0;
    for (int64_t i = 0; i < m; ++i) {
      RowScalars p;
      PrepareRow(a, row0 + i, h, qn + i * dk, kn + i * dk, &p);
      gc[i] = i == 0 ? p.g : gc[i - 1] + p.g;
      beta[i] = p.beta;
    }
    for (int64_t i = 0; i < m; ++i) {
      eg[i] = std::exp(gc[i]);
      egl[i] = std::exp(gc[m - 1] - gc[i]);
    }
    for (int64_t j = 0; j < m; ++j)
      for (int64_t d = 0; d < dk; ++d) kt[d * m + j] = kn[j * dk + d];
    // G = kn kn^T, P = qn kn^T; then the decays exp(gc_i - gc_j), the causal mask and beta.
    // (Lower triangles only, in blocks of kTri rows: columns past a block's last row are
    // never read.)
    for (int64_t i0 = 0; i0 < m; i0 += kTri) {
      const int64_t rows = std::min(kTri, m - i0), cols = std::min(m, i0 + kTri);
      Gemm<false>(rows, cols, dk, kn + i0 * dk, dk, kt, m, G + i0 * m, m, true);
      Gemm<false>(rows, cols, dk, qn + i0 * dk, dk, kt, m, P + i0 * m, m, true);
    }
    for (int64_t i = 0; i < m; ++i) {
      const VF gi = hn::Set(df, gc[i]), bi = hn::Set(df, beta[i]);
      float* g_row = G + i * m;
      float* p_row = P + i * m;
      for (int64_t j = 0; j <= i; j += nl) {
        const int64_t cnt = std::min(nl, i + 1 - j);
        const VF e = hn::Exp(df, hn::Sub(gi, LoadPart(df, gc + j, cnt)));
        StorePart(df, hn::Mul(hn::Mul(bi, LoadPart(df, g_row + j, cnt)), e), g_row + j, cnt);
        StorePart(df, hn::Mul(LoadPart(df, p_row + j, cnt), e), p_row + j, cnt);
      }
      for (int64_t j = i + 1; j < m; ++j) p_row[j] = 0.0f;
    }
    // Right-hand sides: beta v | beta exp(gc) kn; then (I + strict_lower(G)) X = them.
    for (int64_t i = 0; i < m; ++i) {
      float* x = X + i * ldx;
      const float* v = a.v.row(row0 + i) + h * dv;
      for (int64_t c = 0; c < dv; ++c) x[c] = v[c] * beta[i];
      for (int64_t d = 0; d < dk; ++d) x[dv + d] = (kn[i * dk + d] * beta[i]) * eg[i];
    }
    for (int64_t i = 1; i < m; ++i)
      Gemm<true>(1, ldx, i, G + i * m, m, X, ldx, X + i * ldx, ldx, false);
    // v_new = U - W S (in place of U).
    Gemm<true>(m, dv, dk, X + dv, ldx, S, dv, X, ldx, false);
    // out = (qn exp(gc)) S + P v_new.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t d = 0; d < dk; ++d) qn[i * dk + d] *= eg[i];
    float* out = a.out.row(row0) + h * dv;
    Gemm<false>(m, dv, dk, qn, dk, S, dv, out, a.out.stride, true);
    for (int64_t i0 = 0; i0 < m; i0 += kTri) {  // P is zero past the diagonal
      const int64_t rows = std::min(kTri, m - i0);
      Gemm<false>(rows, dv, i0 + rows, P + i0 * m, m, X, ldx, out + i0 * a.out.stride, a.out.stride,
                  false);
    }
    // S = exp(gc_last) S + (kn exp(gc_last - gc))^T v_new.
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t j = 0; j < m; ++j) kt[d * m + j] *= egl[j];
    const VF last = hn::Set(df, eg[m - 1]);
    int64_t e = 0;
    for (; e + nl <= dk * dv; e += nl) hn::StoreU(hn::Mul(hn::LoadU(df, S + e), last), df, S + e);
    for (; e < dk * dv; ++e) S[e] *= eg[m - 1];
    Gemm<false>(dk, dv, m, kt, m, X, ldx, S, dv, false);
  }
  StoreState(S, dk * dv, a.state.dtype, run.out.back() + a.state.offset + head_bytes);
}

// ---- sigmoid_mul ----

void SigmoidMulRows(const SigmoidMulArgs& a, int64_t r_begin, int64_t r_end) {
  const DF df;
  const int64_t nl = Lanes();
  const int64_t n = a.y.n_cols;
  const bool per_row = a.gate.n_cols == 1 && n != 1;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* g = a.gate.row(r);
    float* y = a.y.row(r);
    if (per_row) {
      const VF s = Sigmoid(df, hn::Set(df, g[0]));
      int64_t i = 0;
      for (; i + nl <= n; i += nl) hn::StoreU(hn::Mul(hn::LoadU(df, y + i), s), df, y + i);
      const float s0 = hn::GetLane(s);
      for (; i < n; ++i) y[i] *= s0;
      continue;
    }
    for (int64_t i = 0; i < n; i += nl) {
      const int64_t m = std::min(nl, n - i);
      if (m == nl) {
        hn::StoreU(hn::Mul(hn::LoadU(df, y + i), Sigmoid(df, hn::LoadU(df, g + i))), df, y + i);
      } else {
        StorePart(df, hn::Mul(LoadPart(df, y + i, m), Sigmoid(df, LoadPart(df, g + i, m))), y + i,
                  m);
      }
    }
  }
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale::cpu {

HWY_EXPORT(CausalConvBlock);
HWY_EXPORT(DeltaRuleHeadRecurrent);
HWY_EXPORT(DeltaRuleHeadChunked);
HWY_EXPORT(SigmoidMulRows);

void causal_conv_block(const CausalConvArgs& a, const StateSpan& span, int64_t c_begin,
                       int64_t c_end, float* scratch) {
  HWY_DYNAMIC_DISPATCH(CausalConvBlock)(a, span, c_begin, c_end, scratch);
}

bool delta_rule_chunked(const StateRun& run, int64_t min_rows) {
  const auto n = static_cast<int64_t>(run.out.size());
  if (n <= min_rows || !run.parent.empty()) return false;
  for (int64_t i = 0; i + 1 < n; ++i)
    if (run.out[static_cast<size_t>(i)] != nullptr) return false;
  return true;
}

size_t delta_rule_scratch_floats(const DeltaRuleArgs& a, bool chunked) {
  const size_t rec = RecurrentLayout(a.k_head_dim, a.v_head_dim).total;
  return chunked ? std::max(rec, ChunkedLayout(a.k_head_dim, a.v_head_dim).total) : rec;
}

void delta_rule_head_recurrent(const DeltaRuleArgs& a, const StateSpan& span, int64_t head,
                               float* scratch) {
  HWY_DYNAMIC_DISPATCH(DeltaRuleHeadRecurrent)(a, span, head, scratch);
}

void delta_rule_head_chunked(const DeltaRuleArgs& a, const StateSpan& span, int64_t head,
                             float* scratch) {
  HWY_DYNAMIC_DISPATCH(DeltaRuleHeadChunked)(a, span, head, scratch);
}

void delta_rule_head(const DeltaRuleArgs& a, const StateSpan& span, int64_t head, float* scratch,
                     int64_t chunk_min_rows) {
  if (delta_rule_chunked(*span.run, chunk_min_rows)) {
    delta_rule_head_chunked(a, span, head, scratch);
  } else {
    delta_rule_head_recurrent(a, span, head, scratch);
  }
}

void sigmoid_mul_rows(const SigmoidMulArgs& a, int64_t r_begin, int64_t r_end) {
  HWY_DYNAMIC_DISPATCH(SigmoidMulRows)(a, r_begin, r_end);
}

}  // namespace metrale::cpu
#endif
