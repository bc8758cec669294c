// CpuBackend's activation ops: rms_norm, layer_norm, rope, kv_store, attention, varlen
// attention, gated and plain activations, merge_rows. The
// public Backend ops validated the arguments (backend.cc); these split the work over the pool.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace metrale {

void CpuBackend::do_rms_norm(const RmsNormArgs& a) {
  pool_->parallel_for(static_cast<size_t>(a.x.n_rows), [&](size_t b, size_t e, int) {
    cpu::rms_norm_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::do_rope(const RopeArgs& a) {
  pool_->parallel_for(static_cast<size_t>(a.x.n_rows), [&](size_t b, size_t e, int) {
    cpu::rope_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

namespace {

// Writes n values of x into the cache at dst, dst[i * stride] = x[i], as the cache's element
// type (f16 / bf16 rounded to nearest even, as torch's casts).
void store_strided(const float* x, int64_t n, const KvLayout& kv, void* dst, int64_t stride) {
  if (kv.dtype == DType::kF32) {
    auto* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i * stride] = x[i];
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  constexpr int64_t kChunk = 256;
  uint16_t narrow[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t m = std::min(kChunk, n - i0);
    from_f32(x + i0, kv.dtype, narrow, static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) d[(i0 + i) * stride] = narrow[i];
  }
}

// Writes one token's K of every kv head into its page column (K is transposed within a page).
void store_key(const float* k, int64_t slot, const KvLayerView& cache) {
  const KvLayout& kv = cache.layout;
  const int64_t page = slot / kv.page_size, offset = slot % kv.page_size;
  for (int64_t h = 0; h < kv.n_kv_heads; ++h) {
    void* col = kv.dtype == DType::kF32
                    ? static_cast<void*>(cache.k_page<float>(page, h) + offset)
                    : static_cast<void*>(cache.k_page<uint16_t>(page, h) + offset);
    store_strided(k + h * kv.head_dim, kv.head_dim, kv, col, kv.page_size);
  }
}

}  // namespace

namespace cpu {

void kv_store_items(const KvStoreArgs& a, int64_t item_begin, int64_t item_end) {
  const KvLayout& kv = a.cache.layout;
  const auto n_rows = static_cast<int64_t>(a.slots.size());
  const int64_t hd = kv.head_dim;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t h = item / n_rows, r = item % n_rows;
    const int64_t slot = a.slots[static_cast<size_t>(r)];
    const int64_t page = slot / kv.page_size, offset = slot % kv.page_size;
    void* col = kv.dtype == DType::kF32
                    ? static_cast<void*>(a.cache.k_page<float>(page, h) + offset)
                    : static_cast<void*>(a.cache.k_page<uint16_t>(page, h) + offset);
    store_strided(a.k.row(r) + h * hd, hd, kv, col, kv.page_size);
    auto* v =
        static_cast<std::byte*>(a.cache.v) + (slot * kv.row_elems() + h * hd) * kv.elem_bytes();
    if (kv.dtype == DType::kF32)
      std::memcpy(v, a.v.row(r) + h * hd, static_cast<size_t>(hd) * sizeof(float));
    else
      from_f32(a.v.row(r) + h * hd, kv.dtype, v, static_cast<size_t>(hd));
  }
}

}  // namespace cpu

void CpuBackend::do_kv_store(const KvStoreArgs& a) {
  const auto n = static_cast<size_t>(a.cache.layout.n_kv_heads) * a.slots.size();
  pool_->parallel_for(n, [&](size_t b, size_t e, int) {
    cpu::kv_store_items(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::do_kv_move(const KvMoveArgs& a) {
  const KvLayout& kv = a.cache.layout;
  const auto eb = static_cast<size_t>(kv.elem_bytes());
  const int64_t ps = kv.page_size, cols = kv.row_elems();
  auto* k = static_cast<std::byte*>(a.cache.k);
  auto* v = static_cast<std::byte*>(a.cache.v);
  // K is transposed within its page (kv_cache.h): element (head h, dim d) of slot s sits at
  // page(s) * page_elems + (h * head_dim + d) * page_size + s % page_size.
  const auto k_at = [&](int64_t slot, int64_t col) {
    return k + static_cast<size_t>(slot / ps * kv.page_elems() + col * ps + slot % ps) * eb;
  };
  for (size_t i = 0; i < a.from.size(); ++i) {
    const int64_t from = a.from[i], to = a.to[i];
    if (from == to) continue;
    for (int64_t c = 0; c < cols; ++c) std::memcpy(k_at(to, c), k_at(from, c), eb);
    if (v != nullptr) {
      std::memcpy(v + static_cast<size_t>(to * cols) * eb,
                  v + static_cast<size_t>(from * cols) * eb, static_cast<size_t>(cols) * eb);
    }
  }
}

void CpuBackend::do_attention(const AttentionArgs& a) {
  const cpu::AttentionTask task = cpu::attention_task(a);
  cpu::AttentionPlan plan = cpu::plan_attention(task.shape);
  const auto n = static_cast<size_t>(a.q.n_rows);
  if (attention_spans_.size() < n) attention_spans_.resize(n);
  plan.spans = attention_spans_.data();
  plan.n_spans = cpu::attention_row_spans(task, plan.rows_per_tile, attention_spans_.data());
  pool_->parallel_for(static_cast<size_t>(plan.n_items()), [&](size_t b, size_t e, int) {
    cpu::attention_items(task, plan, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::do_latent_attention(const LatentAttentionArgs& a) {
  const KvLayout& kv = a.cache.layout;
  const int64_t n = a.q.n_rows;
  pool_->parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e, int) {
    for (auto r = static_cast<int64_t>(b); r < static_cast<int64_t>(e); ++r)
      store_key(a.kv.row(r), a.slots[static_cast<size_t>(r)], a.cache);
  });
  // Scratch for as many keys as the cache holds: sized once, so a growing sequence never
  // allocates in a later step.
  const size_t per_thread =
      (cpu::latent_attention_scratch_floats(kv.head_dim, kv.n_slots()) + 15) / 16 * 16;
  float* scratch = thread_scratch(per_thread);
  const int64_t groups = (a.n_heads + cpu::kLatentHeadGroup - 1) / cpu::kLatentHeadGroup;
  // Items cost in proportion to their row's keys (a prefill's causal triangle): claimed one
  // at a time, so both ends of the triangle spread over the threads.
  pool_->parallel_for_dynamic(static_cast<size_t>(n * groups), 1, [&](size_t b, size_t e, int t) {
    cpu::latent_attention_items(a, static_cast<int64_t>(b), static_cast<int64_t>(e),
                                scratch + static_cast<size_t>(t) * per_thread);
  });
}

void CpuBackend::do_gated_activation(const GatedActivationArgs& a) {
  pool_->parallel_for(static_cast<size_t>(a.gate.n_rows), [&](size_t b, size_t e, int) {
    cpu::gated_activation_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::do_add(ConstRows x, Rows y) {
  pool_->parallel_for(static_cast<size_t>(x.n_rows), [&](size_t b, size_t e, int) {
    for (auto r = static_cast<int64_t>(b); r < static_cast<int64_t>(e); ++r) {
      const float* xs = x.row(r);
      float* ys = y.row(r);
      for (int64_t i = 0; i < x.n_cols; ++i) ys[i] += xs[i];
    }
  });
}

void CpuBackend::do_layer_norm(const LayerNormArgs& a) {
  pool_->parallel_for(static_cast<size_t>(a.x.n_rows), [&](size_t b, size_t e, int) {
    cpu::layer_norm_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::do_activation(const ActivationArgs& a) {
  pool_->parallel_for(static_cast<size_t>(a.x.n_rows), [&](size_t b, size_t e, int) {
    cpu::activation_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::do_varlen_attention(const VarlenAttentionArgs& a) {
  const int64_t n = a.q.n_rows;
  const size_t keys = static_cast<size_t>(2 * a.n_heads * a.head_dim * n);  // and the values
  if (varlen_keys_.size() < keys) varlen_keys_.resize(keys);
  const int64_t blocks = (n + cpu::kVarlenRowBlock - 1) / cpu::kVarlenRowBlock;
  pool_->parallel_for(static_cast<size_t>(a.n_heads * blocks), [&](size_t b, size_t e, int) {
    cpu::varlen_transpose_keys(a, varlen_keys_.data(), static_cast<int64_t>(b),
                               static_cast<int64_t>(e));
  });
  int64_t longest = 0;
  for (size_t s = 1; s < a.cu_seqlens.size(); ++s)
    longest = std::max<int64_t>(longest, a.cu_seqlens[s] - a.cu_seqlens[s - 1]);
  const size_t per_thread = (static_cast<size_t>(cpu::kVarlenQueries * longest) + 15) / 16 * 16;
  float* scratch = thread_scratch(per_thread);
  // Contiguous item ranges per thread (item = h * n + r), so its rows group into tiles.
  pool_->parallel_for(static_cast<size_t>(n * a.n_heads), [&](size_t b, size_t e, int t) {
    cpu::varlen_attention_items(a, varlen_keys_.data(), static_cast<int64_t>(b),
                                static_cast<int64_t>(e),
                                scratch + static_cast<size_t>(t) * per_thread);
  });
}

void CpuBackend::do_merge_rows(ConstRows x, Rows out) {
  const int64_t g = x.n_rows / out.n_rows, C = x.n_cols;
  pool_->parallel_for(static_cast<size_t>(out.n_rows), [&](size_t b, size_t e, int) {
    for (auto i = static_cast<int64_t>(b); i < static_cast<int64_t>(e); ++i) {
      for (int64_t j = 0; j < g; ++j) std::copy_n(x.row(g * i + j), C, out.row(i) + j * C);
    }
  });
}

void CpuBackend::do_tap_sum(const TapSumArgs& a) {
  const int64_t C = a.out.n_cols, K = a.n_taps;
  constexpr int64_t kBlock = 64;  // the taps' sum per column block, on the stack
  pool_->parallel_for(static_cast<size_t>(a.out.n_rows), [&](size_t b, size_t e, int) {
    for (auto r = static_cast<int64_t>(b); r < static_cast<int64_t>(e); ++r) {
      float* o = a.out.row(r);
      for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
        const int64_t n = std::min(kBlock, C - c0);
        float acc[kBlock] = {};
        for (int64_t k = 0; k < K; ++k) {
          const auto i = static_cast<size_t>(r * K + k);
          const float w = a.weights[i];
          const float* t = a.table + int64_t{a.taps[i]} * C + c0;
          for (int64_t c = 0; c < n; ++c) acc[c] += w * t[c];
        }
        for (int64_t c = 0; c < n; ++c) o[c0 + c] += acc[c];
      }
    }
  });
}

}  // namespace metrale
