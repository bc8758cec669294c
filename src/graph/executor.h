#pragma once
// Executor: runs a recorded Graph on a backend, op by op — the layer loop. Per pass the caller
// binds the graph's external buffers (the residual stream, the logits) and hands the pass's
// inputs; every node then becomes one call of the backend's public op with its Tensors
// resolved to rows of the arena (plan.h) or of the bound buffers. Nothing is allocated per
// pass.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "graph/graph.h"
#include "graph/plan.h"

namespace metrale {

// Where one layer's recurrent state sits in every state block (engine/state_pool.h).
struct LayerStateOffsets {
  bool has_state = false;
  size_t conv = 0;  // bytes from a block's start
  size_t ssm = 0;
};

// Receives Observe nodes' rows (HiddenSink's contract: index, the pass's rows of it).
using PassObserver = std::function<void(int32_t index, ConstRows rows)>;

// The per-pass inputs of a graph (engine/model.cc fills them; ForwardContext's successor).
// The rows of a sequence are consecutive and are its newest tokens.
struct PassInputs {
  int64_t n_rows = 0;
  int64_t n_wanted = 0;
  std::span<const int32_t> ids;        // [n_rows] token ids
  std::span<const int32_t> positions;  // [n_rows] position of each row in its sequence
  // [n_rows * 3] multimodal rope: each row's (t, h, w) position (models recorded with a
  // MropeSpec; they need it on every pass).
  std::span<const int32_t> positions3;
  std::span<const int32_t> row_index;  // [n_rows] 0, 1, ..., n_rows - 1
  int64_t n_injected = 0;
  std::span<const int32_t> injected_rows;  // [n_injected] ascending rows the caller embeds
  // Vision towers: the merged rows (kMerged buffers) and the segments attention stays within,
  // [n_segments + 1] from 0 to n_rows (one image, or one frame of a video, each).
  int64_t n_merged = 0;
  std::span<const int32_t> cu_seqlens;
  // Qwen2.5-VL's window attention: the windows' segments (over rows in window order), the
  // patch row each window-ordered row takes, and the window-ordered merged row each merged row
  // takes back.
  std::span<const int32_t> cu_window_seqlens;
  std::span<const int32_t> window_rows;     // [n_rows]
  std::span<const int32_t> merged_inverse;  // [n_merged]
  // Qwen3-VL's learned position table: 4 (row, weight) taps per row (TapSum nodes).
  std::span<const int32_t> pos_taps;   // [n_rows * 4]
  std::span<const float> pos_weights;  // [n_rows * 4]
  std::span<const int32_t> row_seq;    // [n_rows] index of each row's sequence in `seqs`
  std::span<const int64_t> slots;      // [n_rows] KV slot each row's K/V is stored to
  // Tree verification (backend.h KeyRemap): the rows whose keys are stored away from their own
  // index; empty when no row of the pass is a tree row.
  KeyRemap tree;
  // [n_rows] LoRA slot of each row (-1: base weights); empty when no row has one.
  std::span<const int32_t> lora_slots;
  std::span<const int32_t> wanted;             // [n_wanted] rows that want logits, ascending
  std::span<const int32_t> wanted_lora_slots;  // [n_wanted]; empty when lora_slots is
  // Pooling (embeddings): the rows whose final hidden states are pooled, ascending, and each
  // pooled output's range of them: output s sums pool_rows[pool_offsets[s] ..
  // pool_offsets[s + 1]) (engine/model.h: StepItem::pool). None may want logits.
  int64_t n_pool_rows = 0;
  int64_t n_pools = 0;
  std::span<const int32_t> pool_rows;     // [n_pool_rows]
  std::span<const int32_t> pool_offsets;  // [n_pools + 1]
  // The pass's sequences; seq_len counts every stored token, this pass's rows included.
  std::span<const KvPageTable> seqs;
  RopeCache rope;
  std::span<const KvLayerView> kv;           // [layers] each layer's pages
  std::span<const StateRun> state_runs;      // [seqs] hybrid models: the blocks of each
  std::span<const LayerStateOffsets> state;  // [layers]; empty: no recurrent state
  DType state_dtype = DType::kF32;
  bool embed_overlays = false;             // some row's LoRA slot overlays embedding rows
  bool head_overlays = false;              // some wanted row's LoRA slot overlays the logits
  const PassObserver* observer = nullptr;  // for a graph recorded with Observe nodes
};

class Executor {
 public:
  // `arena`: at least plan.arena_bytes of backend memory, outliving the executor. `graph` and
  // `plan` too.
  Executor(const Graph& graph, const GraphPlan& plan, void* arena);

  // Binds external buffer `id` for the next passes (its rows: as its row space says). A
  // buffer only nodes that do not run read (the logits of a pass that wants none) may stay
  // unbound; an op reading an unbound one is refused by its validation (null rows).
  void bind(BufferId id, float* data, int64_t stride);
  // Runs every node whose conditions hold: begin(in), then run_node for each.
  void run(Backend& backend, const PassInputs& in);

  // The pieces of run() for a caller that walks the nodes itself (circuit/program.h): begin
  // sets every buffer's rows for the pass; run_node runs one node (whatever its conditions).
  void begin(const PassInputs& in);
  void run_node(Backend& be, const Node& node, const PassInputs& in);
  // Buffer `id`'s memory (the arena's, or the bound rows) and its row stride.
  float* memory(BufferId id) const { return own_[static_cast<size_t>(id)]; }
  int64_t stride(BufferId id) const { return stride_[static_cast<size_t>(id)]; }

 private:
  Rows rows(const Tensor& t) const;
  std::span<int32_t> ints(const Tensor& t) const;
  std::span<float> floats(const Tensor& t) const;
  StateSlice state_slice(const PassInputs& in, int32_t layer, bool conv) const;

  const Graph* graph_;
  const GraphPlan* plan_;
  std::vector<float*> base_;       // [buffers] this pass's rows start here
  std::vector<float*> own_;        // [buffers] the arena's (or the bound) memory
  std::vector<int64_t> stride_;    // [buffers]
  std::vector<int64_t> n_rows_;    // [buffers] this pass's row count
  std::vector<LinearCall> calls_;  // Linears scratch
};

}  // namespace metrale
