// CpuBackend::lora: the rows are grouped by slot (a counting sort, stable), then two passes,
// each split over the thread pool:
//  - the shrink t = A_s x: one item per (slot, block of 4 ranks), each pass over a row's x
//    feeding 4 ranks, A_s read once for all the slot's rows;
//  - the expand y += (B_s t) * scale: B_s is stored transposed ([rank, n_out]), split over
//    blocks of output columns; within a block each row's u = B_s t is accumulated in registers
//    along the columns (rank multiply-adds per vector), the block's B_s rows staying in L1 for
//    the slot's other rows.
// Every sum runs in a fixed order (vector lanes over full vectors, then the scalar tail), so a
// row's result depends on nothing but that row, its slot's weights and the CPU's vector width.
// Highway re-includes this file once per target: these lines keep their order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/lora.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

template <typename T>
HWY_INLINE VF LoadW(const T* p) {
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> dbf;
    return hn::PromoteTo(df, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  }
}

template <typename T>
HWY_INLINE float ScalarW(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
}

// t[k * ldt + j] = A[j] . xs[k] for ranks j in [j0, j0 + nj), nj <= 4, rows k < n_rows.
template <typename T>
void ShrinkT(const T* a, int64_t in, int64_t j0, int64_t nj, const float* const* xs, int64_t n_rows,
             float* t, int64_t ldt) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const int64_t full = in / nl * nl;
  const T* w[4];
  for (int64_t q = 0; q < 4; ++q) w[q] = a + (j0 + std::min(q, nj - 1)) * in;
  for (int64_t k = 0; k < n_rows; ++k) {
    const float* x = xs[k];
    VF c0 = hn::Zero(df), c1 = hn::Zero(df), c2 = hn::Zero(df), c3 = hn::Zero(df);
    for (int64_t i = 0; i < full; i += nl) {
      const VF xv = hn::LoadU(df, x + i);
      c0 = hn::MulAdd(LoadW(w[0] + i), xv, c0);
      c1 = hn::MulAdd(LoadW(w[1] + i), xv, c1);
      c2 = hn::MulAdd(LoadW(w[2] + i), xv, c2);
      c3 = hn::MulAdd(LoadW(w[3] + i), xv, c3);
    }
    const VF c[4] = {c0, c1, c2, c3};
    for (int64_t q = 0; q < nj; ++q) {
      float s = hn::GetLane(hn::SumOfLanes(df, c[q]));
      for (int64_t i = full; i < in; ++i) s += ScalarW(w[q] + i) * x[i];
      t[k * ldt + j0 + q] = s;
    }
  }
}

// For each row k < n_rows, columns [o0, o1): ys[k][o] += (sum over j < rank, in order, of
// t[k * ldt + j] * bt[j * ld + o]) * scale — PEFT's `lora_B(t) * scaling` added to the output.
template <typename T>
void ExpandT(const T* bt, int64_t ld, int64_t rank, const float* t, int64_t ldt, float scale,
             float* const* ys, int64_t n_rows, int64_t o0, int64_t o1) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const VF sv = hn::Set(df, scale);
  for (int64_t k = 0; k < n_rows; ++k) {
    float* y = ys[k];
    const float* tk = t + k * ldt;
    int64_t o = o0;
    for (; o + 4 * nl <= o1; o += 4 * nl) {
      VF u0 = hn::Zero(df), u1 = hn::Zero(df), u2 = hn::Zero(df), u3 = hn::Zero(df);
      for (int64_t j = 0; j < rank; ++j) {
        const T* row = bt + j * ld + o;
        const VF tj = hn::Set(df, tk[j]);
        u0 = hn::MulAdd(tj, LoadW(row), u0);
        u1 = hn::MulAdd(tj, LoadW(row + nl), u1);
        u2 = hn::MulAdd(tj, LoadW(row + 2 * nl), u2);
        u3 = hn::MulAdd(tj, LoadW(row + 3 * nl), u3);
      }
      hn::StoreU(hn::Add(hn::LoadU(df, y + o), hn::Mul(u0, sv)), df, y + o);
      hn::StoreU(hn::Add(hn::LoadU(df, y + o + nl), hn::Mul(u1, sv)), df, y + o + nl);
      hn::StoreU(hn::Add(hn::LoadU(df, y + o + 2 * nl), hn::Mul(u2, sv)), df, y + o + 2 * nl);
      hn::StoreU(hn::Add(hn::LoadU(df, y + o + 3 * nl), hn::Mul(u3, sv)), df, y + o + 3 * nl);
    }
    for (; o + nl <= o1; o += nl) {
      VF u = hn::Zero(df);
      for (int64_t j = 0; j < rank; ++j)
        u = hn::MulAdd(hn::Set(df, tk[j]), LoadW(bt + j * ld + o), u);
      hn::StoreU(hn::Add(hn::LoadU(df, y + o), hn::Mul(u, sv)), df, y + o);
    }
    for (; o < o1; ++o) {
      float u = 0.0f;
      for (int64_t j = 0; j < rank; ++j) u += tk[j] * ScalarW(bt + j * ld + o);
      y[o] += u * scale;
    }
  }
}

void ShrinkF32(const float* a, int64_t in, int64_t j0, int64_t nj, const float* const* xs,
               int64_t n_rows, float* t, int64_t ldt) {
  ShrinkT(a, in, j0, nj, xs, n_rows, t, ldt);
}
void ShrinkBf16(const uint16_t* a, int64_t in, int64_t j0, int64_t nj, const float* const* xs,
                int64_t n_rows, float* t, int64_t ldt) {
  ShrinkT(a, in, j0, nj, xs, n_rows, t, ldt);
}
void ExpandF32(const float* bt, int64_t ld, int64_t rank, const float* t, int64_t ldt, float scale,
               float* const* ys, int64_t n_rows, int64_t o0, int64_t o1) {
  ExpandT(bt, ld, rank, t, ldt, scale, ys, n_rows, o0, o1);
}
void ExpandBf16(const uint16_t* bt, int64_t ld, int64_t rank, const float* t, int64_t ldt,
                float scale, float* const* ys, int64_t n_rows, int64_t o0, int64_t o1) {
  ExpandT(bt, ld, rank, t, ldt, scale, ys, n_rows, o0, o1);
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale {
namespace cpu {
HWY_EXPORT(ShrinkF32);
HWY_EXPORT(ShrinkBf16);
HWY_EXPORT(ExpandF32);
HWY_EXPORT(ExpandBf16);
}  // namespace cpu

void CpuBackend::do_lora(const LoraArgs& a) {
  const LoraWeights& w = *a.weights;
  const int64_t n = a.x.n_rows, R = w.max_rank;
  const bool bf16 = w.dtype == DType::kBF16;
  const size_t elem = bf16 ? 2 : 4;
  // Group the rows by slot: xs / ys list the adapted rows, slot by slot, in row order.
  auto& starts = lora_group_starts_;
  starts.assign(static_cast<size_t>(w.n_slots) + 1, 0);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t s = a.slots[static_cast<size_t>(r)];
    if (s >= 0 && w.rank[s] > 0) ++starts[static_cast<size_t>(s) + 1];
  }
  for (int64_t s = 0; s < w.n_slots; ++s)
    starts[static_cast<size_t>(s) + 1] += starts[static_cast<size_t>(s)];
  const auto n_adapted = static_cast<size_t>(starts.back());
  lora_xs_.resize(n_adapted);
  lora_ys_.resize(n_adapted);
  auto& fill = lora_fill_;
  fill.assign(starts.begin(), starts.end() - 1);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t s = a.slots[static_cast<size_t>(r)];
    if (s < 0 || w.rank[s] == 0) continue;
    const auto k = static_cast<size_t>(fill[static_cast<size_t>(s)]++);
    lora_xs_[k] = a.x.row(r);
    lora_ys_[k] = a.y.row(r);
  }
  // The shrink's items: (slot, first of up to 4 ranks).
  auto& items = lora_items_;
  items.clear();
  for (int64_t s = 0; s < w.n_slots; ++s) {
    if (starts[static_cast<size_t>(s)] == starts[static_cast<size_t>(s) + 1]) continue;
    for (int32_t j = 0; j < w.rank[s]; j += 4) items.push_back({static_cast<int32_t>(s), j});
  }
  // t[k, j]: rank j of the k-th adapted row.
  lora_t_.resize(n_adapted * static_cast<size_t>(R));
  float* t = lora_t_.data();
  const auto* a_base = static_cast<const std::byte*>(w.a);
  const auto* b_base = static_cast<const std::byte*>(w.b);
  auto block = [&](int64_t s) { return s * w.n_experts + a.expert; };
  // Small passes run on this thread: a dispatch would cost more than it saves.
  constexpr int64_t kInlineValues = int64_t{1} << 15;
  auto pass = [&](size_t n_items, int64_t values, auto&& fn) {
    if (values < kInlineValues || pool().size() == 1) {
      fn(size_t{0}, n_items, 0);
    } else {
      pool().parallel_for(n_items, fn);
    }
  };
  const auto rows = static_cast<int64_t>(n_adapted);
  auto shrink = [&](int32_t s, int32_t j0) {
    const int64_t k0 = starts[static_cast<size_t>(s)], k1 = starts[static_cast<size_t>(s) + 1];
    const int64_t nj = std::min<int64_t>(4, w.rank[s] - j0);
    const std::byte* A = a_base + static_cast<size_t>(block(s) * R * w.n_in) * elem;
    if (bf16) {
      HWY_DYNAMIC_DISPATCH(cpu::ShrinkBf16)
      (reinterpret_cast<const uint16_t*>(A), w.n_in, j0, nj, lora_xs_.data() + k0, k1 - k0,
       t + k0 * R, R);
    } else {
      HWY_DYNAMIC_DISPATCH(cpu::ShrinkF32)
      (reinterpret_cast<const float*>(A), w.n_in, j0, nj, lora_xs_.data() + k0, k1 - k0, t + k0 * R,
       R);
    }
  };
  auto expand = [&](int64_t s, int64_t o0, int64_t o1) {
    const int64_t k0 = starts[static_cast<size_t>(s)], k1 = starts[static_cast<size_t>(s) + 1];
    const std::byte* Bt = b_base + static_cast<size_t>(block(s) * R * w.n_out) * elem;
    if (bf16) {
      HWY_DYNAMIC_DISPATCH(cpu::ExpandBf16)
      (reinterpret_cast<const uint16_t*>(Bt), w.n_out, w.rank[s], t + k0 * R, R, w.scale[s],
       lora_ys_.data() + k0, k1 - k0, o0, o1);
    } else {
      HWY_DYNAMIC_DISPATCH(cpu::ExpandF32)
      (reinterpret_cast<const float*>(Bt), w.n_out, w.rank[s], t + k0 * R, R, w.scale[s],
       lora_ys_.data() + k0, k1 - k0, o0, o1);
    }
  };
  // Many distinct slots (a decode step of many adapters): one item per slot, its shrink then
  // its expand, so one dispatch and each thread streams whole slots' A and B^T. The result is
  // the same as the two passes' (the same per-row sums).
  auto& active = lora_active_;
  active.clear();
  for (int64_t s = 0; s < w.n_slots; ++s)
    if (starts[static_cast<size_t>(s)] < starts[static_cast<size_t>(s) + 1])
      active.push_back(static_cast<int32_t>(s));
  if (active.size() >= 2 * static_cast<size_t>(pool().size())) {
    pass(active.size(), rows * R * (w.n_in + w.n_out), [&](size_t i0, size_t i1, int) {
      for (size_t i = i0; i < i1; ++i) {
        for (int32_t j0 = 0; j0 < w.rank[active[i]]; j0 += 4) shrink(active[i], j0);
        expand(active[i], 0, w.n_out);
      }
    });
    return;
  }
  pass(items.size(), rows * R * w.n_in, [&](size_t i0, size_t i1, int) {
    for (size_t i = i0; i < i1; ++i) shrink(items[i].first, items[i].second);
  });
  // The expand over blocks of output columns.
  constexpr int64_t kCols = 256;
  const int64_t n_blocks = (w.n_out + kCols - 1) / kCols;
  pass(static_cast<size_t>(n_blocks), rows * R * w.n_out, [&](size_t c0, size_t c1, int) {
    const int64_t o0 = static_cast<int64_t>(c0) * kCols;
    const int64_t o1 = std::min(w.n_out, static_cast<int64_t>(c1) * kCols);
    for (const int32_t s : active) expand(s, o0, o1);
  });
}

}  // namespace metrale
#endif
