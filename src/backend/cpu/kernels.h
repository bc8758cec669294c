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
  ConstRows x;              // [rows, n_in]
  const void* w = nullptr;  // [n_out, n_in] rows in the format of the kernel called
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
void activation_rows(const ActivationArgs& a, int64_t r_begin, int64_t r_end);
void layer_norm_rows(const LayerNormArgs& a, int64_t r_begin, int64_t r_end);

// Non-causal attention within segments (backend.h VarlenAttentionArgs), in two phases over the
// same `keys_t` scratch (2 * n_heads * head_dim * n_rows floats): varlen_transpose_keys writes
// head h's keys transposed, keys_t[(h * head_dim + d) * n_rows + r] = k[r, h * head_dim + d],
// and after them its values packed head by head, [(h * n_rows + r) * head_dim + d] = v[r, h *
// head_dim + d] (a head's value rows contiguous, where the fused qkv puts them a page apart in a
// long segment), for items [item_begin, item_end) (item = h * row_blocks + row block of
// kVarlenRowBlock rows); then
// varlen_attention_items computes items (item = h * n_rows + r): scores of row r's head h
// against its segment's keys, lanes over keys (vertical sums over d in order), the max, the sum
// of exp in key order, the weighted values in key order. Up to kVarlenQueries consecutive rows
// of a head and segment share each key and value load; every row's arithmetic is the same
// however the rows are grouped. `scores`: this thread's scratch of kVarlenQueries x the longest
// segment's length floats.
inline constexpr int64_t kVarlenQueries = 4;
inline constexpr int64_t kVarlenRowBlock = 64;
void varlen_transpose_keys(const VarlenAttentionArgs& a, float* keys_t, int64_t item_begin,
                           int64_t item_end);
void varlen_attention_items(const VarlenAttentionArgs& a, const float* keys_t, int64_t item_begin,
                            int64_t item_end, float* scores);

// Paged attention over ragged rows (backend.h AttentionArgs): row r is a query of
// tables[row_seq[r]] at positions[r]; it sees keys [max(0, p - window + 1), p].
struct AttentionTask {
  ConstRows q;
  Rows out;
  KvLayerView cache;
  const KvPageTable* tables = nullptr;
  const int32_t* row_seq = nullptr;
  const int32_t* positions = nullptr;
  AttentionShape shape;            // scale already resolved (non-zero)
  const TreeKeys* tree = nullptr;  // [rows] tree verification (backend.h KeyRemap), or null
  const int32_t* tree_keys = nullptr;

  const KvPageTable& table(int64_t row) const { return tables[row_seq[row]]; }
  int64_t position(int64_t row) const { return positions[row]; }
  // Whether some key of `row` is stored away from its own index (a tree verify row): such a
  // row is a tile of its own.
  bool remapped(int64_t row) const { return tree != nullptr && tree[row].root < positions[row]; }
};

// The task of one attention call (the scale resolved); CpuBackend::attention and the circuit's
// split attention (circuit/program.h) both run its items.
AttentionTask attention_task(const AttentionArgs& a);

inline constexpr int64_t kAttentionBlock = 32;  // keys per online-softmax step
inline constexpr int64_t kMaxQueries = 8;       // queries of one tile (they share K/V reads)

// Rows [row_begin, row_end) of one sequence, run as one tile (they share K/V reads).
struct AttentionRowSpan {
  int64_t row_begin = 0, row_end = 0;
};

// How an attention call splits into work items. An item is a tile: a row span x query heads
// [head_begin, head_end) of one GQA group (kv head), at most kMaxQueries queries. Spans are
// runs of consecutive rows of one sequence, cut to rows_per_tile. Items run kv head
// outermost, and the spans of a head alternate from both ends (0, n-1, 1, n-2, ...), so a
// static split over threads keeps one head's K/V hot and balances the causal mask's cost.
struct AttentionPlan {
  struct Tile {
    int64_t row_begin = 0, row_end = 0;
    int64_t kv_head = 0;
    int64_t head_begin = 0, head_end = 0;  // within the group
  };
  int64_t group = 1, n_kv_heads = 1, heads_per_pass = 1, n_passes = 1;
  int64_t rows_per_tile = 1;
  const AttentionRowSpan* spans = nullptr;
  int64_t n_spans = 0;

  int64_t n_items() const { return n_spans * n_kv_heads * n_passes; }
  Tile tile(int64_t item) const;
};
// The plan's head split and rows_per_tile (spans left empty).
AttentionPlan plan_attention(const AttentionShape& shape);
// Cuts the rows of `t` into spans of at most rows_per_tile rows of one sequence; `out` must
// hold t.q.n_rows spans. Returns how many it wrote.
int64_t attention_row_spans(const AttentionTask& t, int64_t rows_per_tile, AttentionRowSpan* out);
void attention_items(const AttentionTask& t, const AttentionPlan& plan, int64_t item_begin,
                     int64_t item_end);

// K/V store (backend.h KvStoreArgs) of items [item_begin, item_end), item = kv head h times
// the rows plus row r: head h of row r's K into its page column and of its V into its row.
// The items are head-major so a static split gives each thread whole heads of every row.
void kv_store_items(const KvStoreArgs& a, int64_t item_begin, int64_t item_end);

// Largest head_dim the attention kernel accepts (its accumulators live on the stack).
inline constexpr int64_t kMaxHeadDim = 512;

// Multi-head latent attention (backend.h LatentAttentionArgs) after the pass's rows were
// stored: items [item_begin, item_end), an item being one row and up to kLatentHeadGroup of
// its heads (item = row * groups + group, groups = ceil(n_heads / kLatentHeadGroup)).
// scratch: latent_attention_scratch_floats(...) floats of this thread's own.
inline constexpr int64_t kLatentHeadGroup = 16;
inline constexpr int64_t kLatentMaxLanes = 16;  // widest float vector of any compiled target
inline size_t latent_attention_scratch_floats(int64_t dim, int64_t max_keys) {
  return static_cast<size_t>((dim + max_keys) * kLatentMaxLanes);
}
void latent_attention_items(const LatentAttentionArgs& a, int64_t item_begin, int64_t item_end,
                            float* scratch);

}  // namespace metrale::cpu
