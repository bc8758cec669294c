// Linear kernels, one instantiation per weight element type (float, hwy::bfloat16_t);
// included once per Highway target by linear_f32.cc / linear_bf16.cc.
// Per-target include guard (Highway's toggle idiom).
#if defined(METRALE_BACKEND_CPU_LINEAR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef METRALE_BACKEND_CPU_LINEAR_INL_H_
#undef METRALE_BACKEND_CPU_LINEAR_INL_H_
#else
#define METRALE_BACKEND_CPU_LINEAR_INL_H_
#endif

#include <algorithm>
#include <cstring>
#include <type_traits>
#include "backend/cpu/kernels.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Widest vector of any x86 target: tail buffers are sized for it.
inline constexpr size_t kLinearMaxLanes = 64 / sizeof(float);

HWY_INLINE VF LoadWeights(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE VF LoadWeights(DF df, const hwy::bfloat16_t* p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  return hn::PromoteTo(df, hn::LoadU(dbf, p));
}

// acc[r * C + c] += x[r][k] * w[c][k] over the full vectors in [k0, k1) (k1 - k0 is a
// multiple of the lane count). Accumulators live in memory between K blocks, which keeps
// the per-lane order identical to the register-only GEMV.
template <int R, int C, class WT>
HWY_INLINE void TileSteps(const float* const* x, const WT* const* w, int64_t k0, int64_t k1,
                          float* HWY_RESTRICT acc) {
  const DF df;
  const auto n = static_cast<int64_t>(hn::Lanes(df));
  VF a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = hn::Load(df, acc + (r * C + c) * n);
  for (int64_t k = k0; k < k1; k += n) {
    VF wv[C];
    for (int c = 0; c < C; ++c) wv[c] = LoadWeights(df, w[c] + k);
    for (int r = 0; r < R; ++r) {
      const VF xv = hn::LoadU(df, x[r] + k);
      for (int c = 0; c < C; ++c) a[r][c] = hn::MulAdd(xv, wv[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) hn::Store(a[r][c], df, acc + (r * C + c) * n);
}

// The last partial vector [k0, n_in), zero-padded through stack copies (so no load ever
// reads past a row), then the horizontal sums plus bias into y.
template <int R, int C, class WT>
HWY_INLINE void TileFinish(const float* const* x, const WT* const* w, int64_t k0, int64_t n_in,
                           const float* HWY_RESTRICT acc, const float* bias, float* const* y) {
  const DF df;
  const auto n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t rest = n_in - k0;
  HWY_ALIGN float xt[R][kLinearMaxLanes] = {};
  HWY_ALIGN WT wt[C][kLinearMaxLanes] = {};
  if (rest > 0) {
    for (int r = 0; r < R; ++r)
      std::memcpy(xt[r], x[r] + k0, static_cast<size_t>(rest) * sizeof(float));
    for (int c = 0; c < C; ++c)
      std::memcpy(wt[c], w[c] + k0, static_cast<size_t>(rest) * sizeof(WT));
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      VF a = hn::Load(df, acc + (r * C + c) * n);
      if (rest > 0) a = hn::MulAdd(hn::Load(df, xt[r]), LoadWeights(df, wt[c]), a);
      float s = hn::GetLane(hn::SumOfLanes(df, a));
      if (bias != nullptr) s += bias[c];
      y[r][c] = s;
    }
  }
}

// Rows x[0..R) against weight rows [o, o + C): the whole K range at once.
template <int R, int C, class WT>
HWY_INLINE void Tile(const LinearTask& t, const WT* w_base, int64_t r0, int64_t o, int64_t k_full,
                     float* HWY_RESTRICT acc) {
  const DF df;
  const float* x[R];
  float* y[R];
  const WT* w[C];
  for (int r = 0; r < R; ++r) {
    x[r] = t.x.row(r0 + r);
    y[r] = t.y.row(r0 + r) + o;
  }
  for (int c = 0; c < C; ++c) w[c] = w_base + (o + c) * t.n_in;
  for (int i = 0; i < R * C; ++i)
    hn::Store(hn::Zero(df), df, acc + i * static_cast<int64_t>(hn::Lanes(df)));
  TileSteps<R, C>(x, w, 0, k_full, acc);
  TileFinish<R, C>(x, w, k_full, t.n_in, acc, t.bias != nullptr ? t.bias + o : nullptr, y);
}

// Calls fn(R, C) with R = rows (1..3, or 4 for 4 and more) and C = cols (4, else 1) as
// std::integral_constant, so a run-time tile shape picks its compiled kernel in one place.
template <class Fn>
HWY_INLINE void WithTileShape(int rows, int cols, Fn&& fn) {
  auto with_rows = [&](auto c) {
    switch (rows) {
      case 1:
        fn(std::integral_constant<int, 1>{}, c);
        break;
      case 2:
        fn(std::integral_constant<int, 2>{}, c);
        break;
      case 3:
        fn(std::integral_constant<int, 3>{}, c);
        break;
      default:
        fn(std::integral_constant<int, 4>{}, c);
        break;
    }
  };
  if (cols == 4) {
    with_rows(std::integral_constant<int, 4>{});
  } else {
    with_rows(std::integral_constant<int, 1>{});
  }
}

template <int C, class WT>
HWY_INLINE void TileRows(int rows, const LinearTask& t, const WT* w, int64_t r0, int64_t o,
                         int64_t k_full, float* acc) {
  static_assert(C == 1 || C == 4);
  WithTileShape(rows, C,
                [&](auto r, auto) { Tile<decltype(r)::value, C>(t, w, r0, o, k_full, acc); });
}

// GEMV (few rows, decode): each group of 4 weight rows is read once for all x rows.
template <class WT>
HWY_INLINE void LinearGemv(const LinearTask& t, const WT* w, int64_t o_begin, int64_t o_end,
                           int64_t k_full) {
  HWY_ALIGN float acc[4 * 4 * kLinearMaxLanes];
  const auto rows = static_cast<int>(t.x.n_rows);
  int64_t o = o_begin;
  for (; o + 4 <= o_end; o += 4) TileRows<4>(rows, t, w, 0, o, k_full, acc);
  for (; o < o_end; ++o) TileRows<1>(rows, t, w, 0, o, k_full, acc);
}

// Cache-blocked GEMM (prefill): a block of kMc x rows against the thread's weight rows in
// K slices of kKc, so an x slice and a weight slice stay in L1/L2 while the vector
// accumulators of the block wait in a per-thread scratch. Weights are streamed once per
// row block instead of once per row.
template <class WT>
HWY_INLINE void LinearGemm(const LinearTask& t, const WT* w, int64_t o_begin, int64_t o_end,
                           int64_t k_full) {
  constexpr int64_t kMc = 32, kNc = 32, kKc = 256;  // kKc: a multiple of every lane count
  const DF df;
  const auto n = static_cast<int64_t>(hn::Lanes(df));
  // One allocation per thread for the life of the program (never on the decode path).
  thread_local hwy::AlignedFreeUniquePtr<float[]> scratch;
  thread_local size_t scratch_size = 0;
  const auto need = static_cast<size_t>(kMc * kNc * n);
  if (scratch_size < need) {
    scratch = hwy::AllocateAligned<float>(need);
    scratch_size = need;
  }
  float* acc_all = scratch.get();
  for (int64_t r0 = 0; r0 < t.x.n_rows; r0 += kMc) {
    const int64_t mr = std::min(kMc, t.x.n_rows - r0);
    for (int64_t ob = o_begin; ob < o_end; ob += kNc) {
      const int64_t nc = std::min(kNc, o_end - ob);
      std::fill(acc_all, acc_all + mr * nc * n, 0.0f);
      // Tiles of 4 x 4 (remainders 1..3 x 1); tile (rt, ot) owns a contiguous acc slab.
      auto for_tiles = [&](auto&& fn) {
        for (int64_t r = 0; r < mr; r += 4) {
          const int rows = static_cast<int>(std::min<int64_t>(4, mr - r));
          for (int64_t o = 0; o < nc;) {
            const int cols = nc - o >= 4 ? 4 : 1;
            fn(rows, cols, r, o, acc_all + (r * nc + o * rows) * n);
            o += cols;
          }
        }
      };
      for (int64_t k0 = 0; k0 < k_full; k0 += kKc) {
        const int64_t k1 = std::min(k_full, k0 + kKc);
        for_tiles([&](int rows, int cols, int64_t r, int64_t o, float* acc) {
          const float* x[4];
          const WT* wr[4];
          for (int i = 0; i < rows; ++i) x[i] = t.x.row(r0 + r + i);
          for (int c = 0; c < cols; ++c) wr[c] = w + (ob + o + c) * t.n_in;
          WithTileShape(rows, cols, [&](auto kr, auto kc) {
            TileSteps<decltype(kr)::value, decltype(kc)::value>(x, wr, k0, k1, acc);
          });
        });
      }
      for_tiles([&](int rows, int cols, int64_t r, int64_t o, float* acc) {
        const float* x[4];
        const WT* wr[4];
        float* y[4];
        for (int i = 0; i < rows; ++i) {
          x[i] = t.x.row(r0 + r + i);
          y[i] = t.y.row(r0 + r + i) + ob + o;
        }
        for (int c = 0; c < cols; ++c) wr[c] = w + (ob + o + c) * t.n_in;
        const float* b = t.bias != nullptr ? t.bias + ob + o : nullptr;
        WithTileShape(rows, cols, [&](auto kr, auto kc) {
          TileFinish<decltype(kr)::value, decltype(kc)::value>(x, wr, k_full, t.n_in, acc, b, y);
        });
      });
    }
  }
}

template <class WT>
HWY_INLINE void LinearRange(const LinearTask& t, int64_t o_begin, int64_t o_end) {
  const DF df;
  const auto n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t k_full = t.n_in / n * n;
  const auto* w = static_cast<const WT*>(t.w);
  if (t.x.n_rows <= 4) {
    LinearGemv(t, w, o_begin, o_end, k_full);
  } else {
    LinearGemm(t, w, o_begin, o_end, k_full);
  }
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
