#pragma once
// Entry points of the CPU SIMD kernels. Each runs one thread's share of an op (a range of
// output rows or items) and dispatches at run time to the best Highway target the CPU has.
// CpuBackend validates arguments and splits the work; tests call these directly on every
// compiled target (hwy::SetSupportedTargetsForTest) and compare with cpu/reference.h.
#include <cstdint>

#include "backend/backend.h"

namespace metrale::cpu {

// y[r, o] = dot(x[r], W[o]) + bias[o] for every row r and o in [o_begin, o_end).
// The dot product's order is fixed: lane j of one vector accumulator sums x[k] * w[k] for
// k = j, j + N, ... in order, the zero-padded tail last, then the lanes are summed. No path
// (GEMV, blocked GEMM, any tiling or thread split) changes that order. Packed bf16 weights
// (prepare(kCopy) on an AVX-512 CPU) use their own kernel with its own fixed order, stated
// in cpu/linear_packed.h; a weight is either packed or not, so a row still never sees two.
// Under Compute::kBF16, prepare(kCopy) packs bf16 weights for the bf16-activation kernel
// instead (cpu/linear_pairs.h, again one fixed order per output).
struct LinearTask {
  ConstRows x;                  // [rows, n_in]
  const void* w = nullptr;      // [n_out, n_in] rows in the format of the kernel called
  int64_t n_in = 0;
  const float* bias = nullptr;  // [n_out] or null
  Rows y;                       // [rows, n_out]
};
void linear_f32(const LinearTask& t, int64_t o_begin, int64_t o_end);
void linear_bf16(const LinearTask& t, int64_t o_begin, int64_t o_end);

// Rows [r_begin, r_end) of each op (validated by the caller).
void rms_norm_rows(const RmsNormArgs& a, int64_t r_begin, int64_t r_end);
void rope_rows(const RopeArgs& a, int64_t r_begin, int64_t r_end);
void gated_activation_rows(const GatedActivationArgs& a, int64_t r_begin, int64_t r_end);
void widen_bf16(const uint16_t* src, int64_t n, float* dst);

// Paged attention over work items (query row, kv head): item i is row i / n_kv_heads,
// kv head i % n_kv_heads. Decode (one_sequence = false): row r is the last token of
// tables[r]. Prefill (one_sequence = true): every row belongs to tables[0] and the rows are
// its last q.n_rows tokens. A query at position p sees keys [max(0, p - window + 1), p].
struct AttentionTask {
  ConstRows q;
  Rows out;
  KvLayerView cache;
  const KvPageTable* tables = nullptr;
  bool one_sequence = false;
  AttentionShape shape;  // scale already resolved (non-zero)

  const KvPageTable& table(int64_t row) const { return tables[one_sequence ? 0 : row]; }
  int64_t position(int64_t row) const {
    return table(row).seq_len - 1 - (one_sequence ? q.n_rows - 1 - row : 0);
  }
};
void attention_items(const AttentionTask& t, int64_t item_begin, int64_t item_end);

// Largest head_dim the attention kernel accepts (its accumulators live on the stack).
inline constexpr int64_t kMaxHeadDim = 512;

}  // namespace metrale::cpu
