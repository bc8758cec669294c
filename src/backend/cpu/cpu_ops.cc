// CpuBackend's activation ops: rms_norm, rope, kv_store, attention, gated activation.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

void check_same(std::string_view what, ConstRows r, int64_t n_rows, int64_t n_cols) {
  METRALE_CHECK(r.data != nullptr || n_rows == 0, what, ": null data");
  METRALE_CHECK(r.n_rows == n_rows && r.n_cols == n_cols, what, ": expected [", n_rows, ", ", n_cols,
                "], found [", r.n_rows, ", ", r.n_cols, "]");
  METRALE_CHECK(r.stride >= r.n_cols, what, ": stride ", r.stride, " is smaller than its ", r.n_cols,
                " columns");
}

void check_attention_shape(const AttentionShape& s, const KvLayout& kv) {
  METRALE_CHECK(s.n_heads > 0 && s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
                "attention: n_heads ", s.n_heads, " must be a positive multiple of n_kv_heads ", s.n_kv_heads);
  METRALE_CHECK(s.head_dim > 0 && s.head_dim <= cpu::kMaxHeadDim, "attention: head_dim ", s.head_dim,
                " must be in [1, ", cpu::kMaxHeadDim, "] on the cpu backend");
  METRALE_CHECK(kv.n_kv_heads == s.n_kv_heads && kv.head_dim == s.head_dim, "attention: KV cache holds ",
                kv.n_kv_heads, " heads of ", kv.head_dim, ", but the layer has ", s.n_kv_heads, " of ",
                s.head_dim);
  METRALE_CHECK(s.sliding_window >= 0, "attention: negative sliding_window ", s.sliding_window);
}

void check_table(const KvPageTable& t, const KvLayout& kv, size_t index) {
  METRALE_CHECK(t.seq_len >= 1, "attention: sequence ", index, " has length ", t.seq_len);
  const int64_t pages = (t.seq_len + kv.page_size - 1) / kv.page_size;
  METRALE_CHECK(static_cast<int64_t>(t.block_table.size()) >= pages, "attention: sequence ", index,
                " of length ", t.seq_len, " needs ", pages, " pages, its block table has ", t.block_table.size());
  for (int64_t i = 0; i < pages; ++i) {
    const int32_t p = t.block_table[static_cast<size_t>(i)];
    METRALE_CHECK(p >= 0 && p < kv.n_pages, "attention: sequence ", index, " block ", i, " names page ", p,
                  ", outside the cache's [0, ", kv.n_pages, ")");
  }
}

float resolve_scale(const AttentionShape& s) {
  return s.scale != 0.0f ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
}

}  // namespace

void CpuBackend::rms_norm(const RmsNormArgs& a) {
  const int64_t n = a.x.n_cols;
  const int64_t group = a.group > 0 ? a.group : n;
  METRALE_CHECK(n > 0 && group > 0 && n % group == 0, "rms_norm: group ", a.group, " must divide the row width ", n);
  METRALE_CHECK(a.weight != nullptr, "rms_norm: no weight");
  METRALE_CHECK(a.eps >= 0.0f, "rms_norm: negative eps ", a.eps);
  check_same("rms_norm input", a.x, a.x.n_rows, n);
  check_same("rms_norm output", a.out, a.x.n_rows, n);
  if (a.residual.data != nullptr) check_same("rms_norm residual", a.residual, a.x.n_rows, n);
  pool_->parallel_for(static_cast<size_t>(a.x.n_rows), [&](size_t b, size_t e, int) {
    cpu::rms_norm_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::rope(const RopeArgs& a) {
  METRALE_CHECK(a.table != nullptr, "rope: no table");
  METRALE_CHECK(a.n_heads > 0 && a.head_dim > 0, "rope: bad head layout ", a.n_heads, " x ", a.head_dim);
  METRALE_CHECK(a.table->rotary_dim() <= a.head_dim, "rope: rotary_dim ", a.table->rotary_dim(),
                " exceeds head_dim ", a.head_dim);
  check_same("rope input", a.x, a.x.n_rows, a.n_heads * a.head_dim);
  METRALE_CHECK(static_cast<int64_t>(a.positions.size()) == a.x.n_rows, "rope: ", a.positions.size(),
                " positions for ", a.x.n_rows, " rows");
  for (size_t i = 0; i < a.positions.size(); ++i) {
    METRALE_CHECK(a.positions[i] >= 0 && a.positions[i] < a.table->max_positions(), "rope: position ",
                  a.positions[i], " of row ", i, " is outside the table's [0, ", a.table->max_positions(), ")");
  }
  pool_->parallel_for(static_cast<size_t>(a.x.n_rows), [&](size_t b, size_t e, int) {
    cpu::rope_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::kv_store(const KvStoreArgs& a) {
  const KvLayout& kv = a.cache.layout;
  METRALE_CHECK(a.cache.k != nullptr && a.cache.v != nullptr, "kv_store: cache has no memory");
  const auto n = static_cast<int64_t>(a.slots.size());
  check_same("kv_store k", a.k, n, kv.row_elems());
  check_same("kv_store v", a.v, n, kv.row_elems());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = a.slots[static_cast<size_t>(i)];
    METRALE_CHECK(slot >= 0 && slot < kv.n_slots(), "kv_store: slot ", slot, " of token ", i,
                  " is outside the cache's [0, ", kv.n_slots(), ")");
  }
  const auto row_bytes = static_cast<size_t>(kv.row_elems()) * sizeof(float);
  pool_->parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e, int) {
    for (auto i = static_cast<int64_t>(b); i < static_cast<int64_t>(e); ++i) {
      const int64_t slot = a.slots[static_cast<size_t>(i)];
      const float* k = a.k.row(i);
      for (int64_t h = 0; h < kv.n_kv_heads; ++h) {  // K is transposed within its page
        float* col = a.cache.k_page(slot / kv.page_size, h) + slot % kv.page_size;
        for (int64_t d = 0; d < kv.head_dim; ++d) col[d * kv.page_size] = k[h * kv.head_dim + d];
      }
      std::memcpy(a.cache.v_row(slot), a.v.row(i), row_bytes);
    }
  });
}

void CpuBackend::attention_decode(const DecodeAttentionArgs& a) {
  check_attention_shape(a.shape, a.cache.layout);
  const int64_t width = a.shape.n_heads * a.shape.head_dim;
  const auto n = static_cast<int64_t>(a.seqs.size());
  check_same("attention_decode q", a.q, n, width);
  check_same("attention_decode out", a.out, n, width);
  for (size_t i = 0; i < a.seqs.size(); ++i) check_table(a.seqs[i], a.cache.layout, i);
  cpu::AttentionTask task{.q = a.q, .out = a.out, .cache = a.cache, .tables = a.seqs.data(),
                          .one_sequence = false, .shape = a.shape};
  task.shape.scale = resolve_scale(a.shape);
  pool_->parallel_for(static_cast<size_t>(cpu::plan_attention(task).n_items()), [&](size_t b, size_t e, int) {
    cpu::attention_items(task, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::attention_prefill(const PrefillAttentionArgs& a) {
  check_attention_shape(a.shape, a.cache.layout);
  const int64_t width = a.shape.n_heads * a.shape.head_dim;
  const int64_t n = a.q.n_rows;
  check_same("attention_prefill q", a.q, n, width);
  check_same("attention_prefill out", a.out, n, width);
  check_table(a.seq, a.cache.layout, 0);
  METRALE_CHECK(n <= a.seq.seq_len, "attention_prefill: ", n, " new tokens but the sequence holds only ",
                a.seq.seq_len);
  cpu::AttentionTask task{.q = a.q, .out = a.out, .cache = a.cache, .tables = &a.seq,
                          .one_sequence = true, .shape = a.shape};
  task.shape.scale = resolve_scale(a.shape);
  pool_->parallel_for(static_cast<size_t>(cpu::plan_attention(task).n_items()), [&](size_t b, size_t e, int) {
    cpu::attention_items(task, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::gated_activation(const GatedActivationArgs& a) {
  check_same("gated_activation gate", a.gate, a.gate.n_rows, a.gate.n_cols);
  check_same("gated_activation up", a.up, a.gate.n_rows, a.gate.n_cols);
  check_same("gated_activation out", a.out, a.gate.n_rows, a.gate.n_cols);
  pool_->parallel_for(static_cast<size_t>(a.gate.n_rows), [&](size_t b, size_t e, int) {
    cpu::gated_activation_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

}  // namespace metrale
