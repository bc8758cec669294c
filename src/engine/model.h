#pragma once
// Model: a loaded checkpoint (config, the family's Architecture on a backend, tokenizer) plus
// the KV pool and the memory of one pass. Every pass is one ragged step (step()): any mix of
// sequences, each appending one or more tokens — prefill chunks, decode rows, the k draft
// tokens of a verify. prefill() and decode() are the two common shapes of it. Nothing is
// allocated per step.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "circuit/program.h"
#include "core/thread_pool.h"
#include "engine/kv_pool.h"
#include "engine/state_pool.h"
#include "engine/vision_encoder.h"
#include "graph/executor.h"
#include "graph/plan.h"
#include "io/config/model_config.h"
#include "io/safetensors/checkpoint.h"
#include "io/tokenizer/tokenizer.h"
#include "layers/architecture.h"
#include "layers/rope_table.h"
#include "lora/lora_pool.h"
#include "weights/tensor_loader.h"

namespace metrale {

struct LoadOptions {
  int n_threads = 0;           // 0: default_thread_count() (METRALE_THREADS or the cores)
  int64_t kv_tokens = 0;       // KV capacity over all sequences; 0: min(context, 4096)
  int64_t page_size = 16;      // tokens per KV page
  int64_t max_rows = 128;      // most rows (tokens) of one step
  std::string device = "cpu";  // backend_factory.h
  WeightPlacement placement = WeightPlacement::kCopy;
  // kBF16: linear layers round their input rows to bf16 (llama.cpp's BF16 numerics, faster
  // prefill on AVX-512 BF16 CPUs); needs placement kCopy. kF32 keeps HF's upcast numerics.
  Compute compute = Compute::kF32;
  bool load_tokenizer = true;  // read tokenizer.json when the directory has one
  // Hybrid models (Gated DeltaNet layers): the recurrent-state pool (engine/state_pool.h).
  int64_t max_seqs = 8;                  // sequences holding a state slot at once
  DType state_dtype = DType::kF32;       // state storage: kF32 or kF16
  DType kv_dtype = DType::kF32;          // KV cache storage: kF32, kF16 or kBF16 (attention in f32)
  int64_t state_snapshots = 0;           // snapshot blocks for prefix caching
  std::optional<uint64_t> state_budget;  // bytes for the pool; none: the deepest ring
  std::optional<int64_t> state_ring_depth;  // force a rollback depth (must fit the budget)
  void (*progress)(uint64_t done_bytes, uint64_t total_bytes) = nullptr;
  // Which executor runs decode steps: the layer loop, or the circuit's compiled programs
  // (circuit/program.h) for widths 1, 2, 4, ... up to max_rows on the CPU backend.
  ExecutorKind executor = ExecutorKind::kLayers;
  // What the circuit's programs may fuse (circuit/fusion.h; `--fusion`).
  FusionPolicy fusion{};
  // Vision-language checkpoints: the most patches one vision tower pass takes (its arena is
  // planned for this many).
  int64_t max_image_patches = 4096;
};

// One sequence's place in the KV cache (and, for hybrid models, in the state pool).
// Default-construct; hand back with Model::release. Not copyable in spirit: a copy would
// share the original's state slot, which the pool refuses (the slot is bound to this object).
struct Sequence {
  std::vector<int32_t> tokens;       // every token whose K/V is cached, in order
  std::vector<int32_t> block_table;  // its KV pages
  int32_t state_slot = -1;           // hybrid models: its slot in the state pool (-1: none yet)
  // Hybrid models: the fewest tokens truncate() can keep — the oldest token count whose
  // recurrent state is still in the slot's ring.
  int64_t state_floor = 0;
  // Hybrid models, after a step whose item was a draft tree: the tokens before it (its root is
  // token tree_start). Its rows' states are in the ring, each in its own version, until
  // compact() keeps one path; -1 otherwise.
  int64_t tree_start = -1;
  // The LoRA adapter every row of this sequence runs with (Model::set_adapter; base: none).
  LoraRef lora;
  // Multimodal rope (Model::multimodal_rope()): a row given no (t, h, w) positions rotates by
  // (p + rope_delta) on every axis, p its position in the sequence — transformers' rope delta
  // after a prompt with images carried into decode. 0 for text.
  int64_t rope_delta = 0;
};

// Receives the residual stream after the embedding (index 0) and after each layer (1..L;
// the last one after the final norm, as HF's output_hidden_states). Rows are the step's, item
// by item; the last index has the rows that want logits only (the head runs on those).
using HiddenSink = std::function<void(int64_t index, ConstRows h)>;

// Which logits rows a step item wants.
enum class LogitRows : uint8_t { kNone, kLast, kAll };

// Which rows of a step item are pooled (embeddings, engine/embedding.h): their hidden states
// after the final norm are added onto the item's row of step()'s `pooled` output.
enum class PoolRows : uint8_t { kNone, kFirst, kLast, kAll };

// One sequence's share of a step: `ids` are appended to `seq`.
struct StepItem {
  Sequence* seq = nullptr;
  std::span<const int32_t> ids;
  LogitRows logits = LogitRows::kLast;
  // Rows to pool; an item that pools wants no logits (logits = kNone).
  PoolRows pool = PoolRows::kNone;
  // Multimodal rope only: [ids.size() * 3] each row's (t, h, w) rope position; empty: every
  // axis at the row's position + seq->rope_delta. (The KV cache keeps 1-D positions.)
  std::span<const int32_t> positions3;
  // Rows whose input embedding is given instead of their token's (image / video features):
  // embeds.row(k) [hidden] is the input of row embed_rows[k] (ascending, in [0, ids.size())).
  ConstRows embeds{};
  std::span<const int32_t> embed_rows;
  // Tree verification (speculative/draft_tree.h): [ids.size()] the parent row of each row
  // within the item, -1 for row 0 (the tree's root) and an earlier row for every other; empty:
  // a chain (row j after row j - 1). Row j sits at position start + depth(j) (start: the
  // tokens cached before the step; the root's depth is 0) and sees the context and its own
  // ancestors, as if they were the only rows — its logits are bit for bit the ones the same
  // path gives as a chain. Its K/V is stored at index start + j, and the sequence's tokens
  // gain the rows in item order: compact() keeps one path. Not with multimodal rows. Hybrid
  // models: each row's recurrent state continues from its parent's, every row's kept in the
  // ring, so a tree has at most ring_depth + 1 rows.
  std::span<const int32_t> tree;
};

class Model {
 public:
  static std::unique_ptr<Model> load(const std::filesystem::path& dir,
                                     const LoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  // nullptr when the directory has no tokenizer.json (or load_tokenizer was false).
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  Backend& backend() { return *backend_; }
  const Architecture& architecture() const { return *arch_; }
  ThreadPool& pool() { return *pool_; }
  int64_t max_rows() const { return max_rows_; }
  int64_t vocab_size() const { return config_.vocab_size; }
  // The checkpoint's vision tower (engine/vision_encoder.h); nullptr for text-only models and
  // for towers not built yet (whose tensors are then recognised and left unloaded).
  VisionEncoder* vision() { return vision_.get(); }
  const VisionEncoder* vision() const { return vision_.get(); }
  // The width of StepItem::embeds' rows: hidden_size, times 1 + the deepstack features
  // (Qwen3-VL: the vision tower's out_cols()).
  int64_t injected_cols() const { return arch_->injected_cols(); }
  // Whether the rope is multimodal (M-RoPE: StepItem::positions3 and Sequence::rope_delta).
  bool multimodal_rope() const { return !mrope_inv_freq_.empty(); }
  // The most tokens one sequence can hold: the rope table and KV capacity bound it.
  int64_t context_limit() const { return context_; }
  const KvPool& kv_pool() const { return *kv_; }
  // The pool itself, for whoever shares pages between sequences (serve/prefix_cache.h:
  // retain / drop on pages a sequence holds).
  KvPool& kv_pool() { return *kv_; }
  // The recurrent-state pool; nullptr for models without linear-attention layers.
  const StatePool* state_pool() const { return state_.get(); }
  // Bytes of the checkpoint's weights.
  uint64_t weight_bytes() const { return weight_bytes_; }
  // The declared quantization method ("compressed-tensors", "modelopt", "fp8"; "" when none)
  // and, per linear module, the format it was loaded in and the rule that decided it.
  const std::string& quant_method() const { return quant_method_; }
  const std::vector<TensorLoader::ModuleReport>& linear_report() const { return linear_report_; }
  // Bytes of weights one decoded token reads (the roofline's numerator): for an MoE model
  // the router and top-k experts of each sparse layer, not every expert.
  uint64_t active_weight_bytes() const { return arch_->active_bytes_per_token(); }

  // The recorded pass every step runs (graph/graph.h) and its memory plan for max_rows().
  const Graph& graph() const { return plain_.graph; }
  const GraphPlan& graph_plan() const { return plain_.plan; }
  // The circuit's programs (LoadOptions::executor = kCircuit), one per decode width 1, 2, 4, ...
  // up to max_rows(), ascending; empty for the layer loop, or where the backend has none (a
  // non-CPU backend: every step runs the layer loop). A step of another width, or one a program
  // does not accept (Program::accepts: prefill chunks, verify rows, LoRA rows, a HiddenSink),
  // runs the layer loop.
  std::span<const std::unique_ptr<Program>> programs() const { return programs_; }
  ExecutorKind executor() const { return executor_; }
  const FusionPolicy& fusion() const { return fusion_; }
  // Steps the programs ran, and steps the layer loop ran (since load).
  int64_t circuit_steps() const { return circuit_steps_; }
  int64_t layer_steps() const { return layer_steps_; }

  // One ragged pass over `items` (distinct sequences, at most max_rows() tokens in all).
  // logits receives, item by item, the rows each asked for: [n_wanted, V]. pooled holds one
  // row per item that pools, in item order: [n_pooling, hidden] contiguous, and each gets the
  // sum of its pooled rows' final hidden states added onto it (Backend::segment_sum: a sum
  // carried over the steps of a long input's chunks equals one step's, bit for bit; zero it
  // first for a fresh sum). Throws (leaving every sequence unchanged) on ids outside the
  // vocabulary, a sequence that would outgrow context_limit(), or a full KV pool.
  void step(std::span<const StepItem> items, std::span<float> logits,
            const HiddenSink* sink = nullptr, std::span<float> pooled = {});
  // Appends `ids` to `seq` in chunks of at most max_rows(). logits: [ids.size(), V] when
  // all_logits, else [1, V] for the last token.
  void prefill(Sequence& seq, std::span<const int32_t> ids, std::span<float> logits,
               bool all_logits = false, const HiddenSink* sink = nullptr);
  // Appends tokens[i] to *seqs[i] for every i, in one step; logits: [n, V].
  void decode(std::span<Sequence* const> seqs, std::span<const int32_t> tokens,
              std::span<float> logits);
  // Keeps the first n tokens of `seq` (rollback of rejected draft tokens); pages no longer
  // needed go back to the pool. A later step recomputes whatever follows. Hybrid models:
  // n >= seq.state_floor (the ring keeps the state after each of the last ring_depth tokens
  // of steps of at most ring_depth + 1 tokens; a longer step keeps only its final state).
  void truncate(Sequence& seq, int64_t n);
  // Keeps the first `keep` tokens of `seq`, then its tokens at indices rows[0] < rows[1] < ...
  // (each at or past `keep`), moving their K/V to indices keep, keep + 1, ...; the rest is
  // dropped as truncate() drops it. A tree verify's accepted path is kept this way. Hybrid
  // models: only right after a draft tree's step, keeping its root (keep = tree_start + 1) and
  // a path of its rows; the state after the path's last row becomes the sequence's. Throws
  // (seq unchanged) on rows out of order or range, or a hybrid sequence that is not there.
  void compact(Sequence& seq, int64_t keep, std::span<const int64_t> rows);
  // Returns the sequence's pages to the pool and empties it (and drops its adapter).
  void release(Sequence& seq);

  // Prefix caching (serve/prefix_cache.h). A page shared by several sequences is only read
  // while they agree on its tokens: step() copies a shared page before writing into it
  // (after a truncate() into it), so sharing never changes another sequence's results.
  //
  // Makes the empty `seq` (its adapter may be set) start with `tokens`, whose K/V are in
  // `pages` (tokens.size() == pages.size() * page size; the pages retained, not copied).
  // Hybrid models also need the recurrent state after those tokens: `snapshot` names the
  // StatePool snapshot block holding it (save_state), copied into a state slot the
  // sequence acquires; dense models take no snapshot (-1). Throws an Error (seq unchanged)
  // on a non-empty seq, a length mismatch, ids outside the vocabulary, a prefix past the
  // context, bad or repeated pages, or a missing / stray / out-of-range snapshot.
  void adopt_prefix(Sequence& seq, std::span<const int32_t> tokens, std::span<const int32_t> pages,
                    int64_t snapshot = -1);
  // Hybrid models: copies the recurrent state after seq's current tokens into snapshot
  // block `snapshot` (any time the ring still holds it: right after a step, or a truncate()
  // to a count at or past state_floor). Throws for dense models, a sequence without a state
  // slot, or a snapshot index outside [0, LoadOptions::state_snapshots).
  void save_state(const Sequence& seq, int64_t snapshot);

  // LoRA: makes the slot pool (lora/lora_pool.h) and attaches it to every layer; once per
  // model. Adapters are then loaded into it (lora_pool()->load) and chosen per sequence.
  LoraPool& enable_lora(const LoraPoolOptions& options);
  // nullptr until enable_lora().
  LoraPool* lora_pool() { return lora_.get(); }
  // Runs `seq` with the loaded adapter `name` ("" for the base model), holding a reference to
  // it until release(seq). The sequence must be empty (its cache would mix two models).
  void set_adapter(Sequence& seq, const std::string& name);

 private:
  Model() = default;
  void check_ids(std::span<const int32_t> ids) const;
  // Throws unless a draft tree item's parents make a tree of its rows and the model can run it.
  void check_tree(const StepItem& item, size_t index) const;
  // Throws unless the item's (t, h, w) positions and injected embeddings fit it and the model.
  void check_multimodal(const StepItem& item, size_t index) const;
  // Hybrid models: gives each item's sequence a state slot if it has none, and points
  // state_runs_ / state_out_ at the blocks each row reads and writes.
  void bind_states(std::span<const StepItem> items);
  // Records the model's pass (plain, and with Observe nodes for a HiddenSink), plans its
  // memory and makes the executors: at load, and again when LoRA attaches its nodes.
  void record_graphs();
  // Runs the recorded pass over the step's inputs; logits: [in.n_wanted, V], pooled:
  // [in.n_pools, hidden].
  void run(const PassInputs& in, float* logits, float* pooled, const HiddenSink* sink);

  std::filesystem::path dir_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Architecture> arch_;
  std::unique_ptr<VisionEncoder> vision_;
  RopeTable rope_;
  DeviceFloats rope_cos_, rope_sin_;  // rope_'s tables in backend memory
  // Multimodal rope: the frequencies and the axis each follows (empty: 1-D rope).
  DeviceFloats mrope_inv_freq_;
  DeviceArray<int32_t> mrope_axes_;
  MropeSpec mrope_;
  std::unique_ptr<KvPool> kv_;
  std::unique_ptr<StatePool> state_;  // hybrid models only
  std::unique_ptr<LoraPool> lora_;    // enable_lora()
  int64_t max_rows_ = 0;
  int64_t context_ = 0;
  uint64_t weight_bytes_ = 0;
  std::string quant_method_;
  std::vector<TensorLoader::ModuleReport> linear_report_;

  // The recorded pass: plain, and observed (for a HiddenSink); one arena serves both.
  struct Pass {
    Graph graph;
    ModelIo io;
    GraphPlan plan;
    std::unique_ptr<Executor> executor;
  };
  Pass plain_, observed_;
  Buffer arena_;
  ExecutorKind executor_ = ExecutorKind::kLayers;
  FusionPolicy fusion_{};
  std::vector<std::unique_ptr<Program>> programs_;  // the plain pass's, by ascending width
  int64_t circuit_steps_ = 0, layer_steps_ = 0;
  std::vector<KvLayerView> kv_views_;             // [layers]
  std::vector<LayerStateOffsets> state_offsets_;  // [layers] hybrid models

  // Per-step memory, sized once for max_rows_.
  Buffer pass_buffer_;
  Rows h_, delta_;
  std::vector<int32_t> ids_, positions_, row_seq_, lora_slots_, want_, want_slots_;
  std::vector<int32_t> positions3_, row_index_, injected_rows_;
  std::vector<int32_t> pool_rows_, pool_offsets_;  // [max_rows], [max_rows + 1]
  Buffer injected_;  // [max_rows, injected_cols()] the step's injected rows (backend memory)
  int64_t injected_stride_ = 0;
  std::vector<int64_t> slots_;
  std::vector<TreeKeys> tree_rows_;           // [max_rows] tree verification (StepItem::tree)
  std::vector<int32_t> tree_keys_;            // [max_rows * (max_rows + 1) / 2]
  std::vector<int32_t> tree_depth_;           // [max_rows] one item's rows' depths
  std::vector<int64_t> move_from_, move_to_;  // compact()'s moves
  std::vector<KvPageTable> tables_;
  std::vector<StateRun> state_runs_;   // [items] hybrid models: each sequence's state blocks
  std::vector<std::byte*> state_out_;  // [rows] the blocks after each row (StateRun::out)
  std::vector<StepItem> items_;        // decode()'s items
};

}  // namespace metrale
