// CpuBackend::lora: the rows are grouped by slot (a counting sort, stable), then two passes,
// each split over the thread pool: the shrink t = A_s x (one item per (slot, rank) pair, so A_s
// is read once for all the slot's rows) and the expand y += (B_s t) * scale (split over output
// columns, each B_s row read once for all the slot's rows). Every sum runs in a fixed order
// (Highway lanes over full vectors, then the scalar tail), so a row's result depends on nothing
// but that row, its slot's weights and the CPU's vector width. Highway re-includes this file
// once per target: these lines keep their order.
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

float DotF32(const float* w, const float* x, int64_t n) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  auto acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) acc = hn::MulAdd(hn::LoadU(df, w + i), hn::LoadU(df, x + i), acc);
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

float DotBf16(const uint16_t* w, const float* x, int64_t n) {
  const DF df;
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const auto* p = reinterpret_cast<const hwy::bfloat16_t*>(w);
  auto acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + nl <= n; i += nl)
    acc = hn::MulAdd(hn::PromoteTo(df, hn::LoadU(dbf, p + i)), hn::LoadU(df, x + i), acc);
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(w[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    s += f * x[i];
  }
  return s;
}

// y[o0, o1) += scale * u, u[o] = sum over j < rank of t[j] * bt[j * ld + o] (in j order):
// PEFT's `lora_B(t) * scaling` added to the base output, for one row. o1 - o0 <= kExpandCols.
constexpr int64_t kExpandCols = 64;
template <typename T>
void ExpandT(const T* bt, int64_t ld, int64_t rank, const float* t, float scale, float* y,
             int64_t o0, int64_t o1) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float u[kExpandCols];
  const int64_t n = o1 - o0;
  const int64_t full = n / nl * nl;
  for (int64_t i = 0; i < n; ++i) u[i] = 0.0f;
  for (int64_t j = 0; j < rank; ++j) {
    const T* row = bt + j * ld + o0;
    const auto tj = hn::Set(df, t[j]);
    int64_t i = 0;
    for (; i < full; i += nl) {
      hn::VFromD<DF> w;
      if constexpr (std::is_same_v<T, float>) {
        w = hn::LoadU(df, row + i);
      } else {
        const hn::Rebind<hwy::bfloat16_t, DF> dbf;
        w = hn::PromoteTo(df, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(row) + i));
      }
      hn::Store(hn::MulAdd(tj, w, hn::Load(df, u + i)), df, u + i);
    }
    for (; i < n; ++i) {
      float wv;
      if constexpr (std::is_same_v<T, float>) {
        wv = row[i];
      } else {
        const uint32_t bits = static_cast<uint32_t>(row[i]) << 16;
        std::memcpy(&wv, &bits, sizeof wv);
      }
      u[i] += t[j] * wv;
    }
  }
  for (int64_t i = 0; i < n; ++i) y[o0 + i] += u[i] * scale;
}

void ExpandF32(const float* bt, int64_t ld, int64_t rank, const float* t, float scale, float* y,
               int64_t o0, int64_t o1) {
  ExpandT(bt, ld, rank, t, scale, y, o0, o1);
}
void ExpandBf16(const uint16_t* bt, int64_t ld, int64_t rank, const float* t, float scale, float* y,
                int64_t o0, int64_t o1) {
  ExpandT(bt, ld, rank, t, scale, y, o0, o1);
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale {
namespace cpu {
HWY_EXPORT(DotF32);
HWY_EXPORT(DotBf16);
HWY_EXPORT(ExpandF32);
HWY_EXPORT(ExpandBf16);
}  // namespace cpu

namespace {

// One weight's row of `n` values at element offset `at`, dotted with x.
float dot(const LoraWeights& w, const void* base, int64_t at, const float* x, int64_t n) {
  if (w.dtype == DType::kBF16) {
    return HWY_DYNAMIC_DISPATCH(cpu::DotBf16)(static_cast<const uint16_t*>(base) + at, x, n);
  }
  return HWY_DYNAMIC_DISPATCH(cpu::DotF32)(static_cast<const float*>(base) + at, x, n);
}

}  // namespace

void CpuBackend::do_lora(const LoraArgs& a) {
  const LoraWeights& w = *a.weights;
  const int64_t n = a.x.n_rows, R = w.max_rank;
  // Group the rows by slot: order[] lists the adapted rows, slot by slot, in row order.
  auto& starts = lora_group_starts_;
  starts.assign(static_cast<size_t>(w.n_slots) + 1, 0);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t s = a.slots[static_cast<size_t>(r)];
    if (s >= 0 && w.rank[s] > 0) ++starts[static_cast<size_t>(s) + 1];
  }
  for (int64_t s = 0; s < w.n_slots; ++s)
    starts[static_cast<size_t>(s) + 1] += starts[static_cast<size_t>(s)];
  auto& order = lora_order_;
  order.resize(static_cast<size_t>(starts.back()));
  auto& fill = lora_fill_;
  fill.assign(starts.begin(), starts.end() - 1);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t s = a.slots[static_cast<size_t>(r)];
    if (s >= 0 && w.rank[s] > 0) order[static_cast<size_t>(fill[static_cast<size_t>(s)]++)] = r;
  }
  // The (slot, rank) items of the shrink.
  auto& items = lora_items_;
  items.clear();
  for (int64_t s = 0; s < w.n_slots; ++s) {
    if (starts[static_cast<size_t>(s)] == starts[static_cast<size_t>(s) + 1]) continue;
    for (int32_t j = 0; j < w.rank[s]; ++j) items.push_back({static_cast<int32_t>(s), j});
  }
  // t[i, j]: rank j of the i-th adapted row (in `order`).
  lora_t_.resize(order.size() * static_cast<size_t>(R));
  float* t = lora_t_.data();
  const int64_t expert_of = a.expert;
  auto block = [&](int64_t s) { return s * w.n_experts + expert_of; };
  // Small passes run on this thread: a dispatch would cost more than it saves.
  constexpr int64_t kInlineValues = int64_t{1} << 15;
  auto pass = [&](size_t n_items, int64_t values, auto&& fn) {
    if (values < kInlineValues || pool().size() == 1) {
      fn(size_t{0}, n_items, 0);
    } else {
      pool().parallel_for(n_items, fn);
    }
  };
  const auto n_adapted = static_cast<int64_t>(order.size());
  pass(items.size(), n_adapted * R * w.n_in, [&](size_t i0, size_t i1, int) {
    for (size_t i = i0; i < i1; ++i) {
      const auto [s, j] = items[i];
      const int64_t a_at = (block(s) * R + j) * w.n_in;
      for (int64_t k = starts[static_cast<size_t>(s)]; k < starts[static_cast<size_t>(s) + 1];
           ++k) {
        t[k * R + j] = dot(w, w.a, a_at, a.x.row(order[static_cast<size_t>(k)]), w.n_in);
      }
    }
  });
  // The expand, split over output columns: B_s is stored transposed ([rank, n_out]), so each
  // row's piece of u = B_s t is rank contiguous multiply-adds over the piece's columns.
  constexpr int64_t kCols = 64;  // = kExpandCols
  const int64_t n_chunks = (w.n_out + kCols - 1) / kCols;
  const bool bf16 = w.dtype == DType::kBF16;
  pass(static_cast<size_t>(n_chunks), n_adapted * R * w.n_out, [&](size_t c0, size_t c1, int) {
    for (int64_t s = 0; s < w.n_slots; ++s) {
      const int64_t k0 = starts[static_cast<size_t>(s)], k1 = starts[static_cast<size_t>(s) + 1];
      if (k0 == k1) continue;
      const int64_t rank = w.rank[s];
      const float scale = w.scale[s];
      const int64_t b_at = block(s) * R * w.n_out;
      for (auto c = static_cast<int64_t>(c0); c < static_cast<int64_t>(c1); ++c) {
        const int64_t o0 = c * kCols, o1 = std::min(w.n_out, o0 + kCols);
        for (int64_t k = k0; k < k1; ++k) {
          float* y = a.y.row(order[static_cast<size_t>(k)]);
          if (bf16) {
            HWY_DYNAMIC_DISPATCH(cpu::ExpandBf16)
            (static_cast<const uint16_t*>(w.b) + b_at, w.n_out, rank, t + k * R, scale, y, o0, o1);
          } else {
            HWY_DYNAMIC_DISPATCH(cpu::ExpandF32)
            (static_cast<const float*>(w.b) + b_at, w.n_out, rank, t + k * R, scale, y, o0, o1);
          }
        }
      }
    }
  });
}

}  // namespace metrale
#endif
