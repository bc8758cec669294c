#pragma once
// Model: a loaded checkpoint (config, weights on a backend, tokenizer) plus the KV pool and
// the scratch memory of one pass. The two passes:
//   prefill(seq, ids)  appends ids to one sequence, in chunks of at most max_rows();
//   decode(seqs, ids)  appends one token to each of several sequences in one step.
// Both write logits for the caller. Nothing is allocated per decode step.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "engine/kv_pool.h"
#include "io/config/model_config.h"
#include "io/safetensors/checkpoint.h"
#include "io/tokenizer/tokenizer.h"
#include "layers/dense_layer.h"
#include "weights/dense_weights.h"

namespace metrale {

struct LoadOptions {
  int n_threads = 0;          // 0: default_thread_count() (METRALE_THREADS or the cores)
  int64_t kv_tokens = 0;      // KV capacity over all sequences; 0: min(context, 4096)
  int64_t page_size = 16;     // tokens per KV page
  int64_t max_rows = 128;     // largest prefill chunk / decode batch
  WeightPlacement placement = WeightPlacement::kCopy;
  // kBF16: linear layers round their input rows to bf16 (llama.cpp's BF16 numerics, faster
  // prefill on AVX-512 BF16 CPUs); needs placement kCopy. kF32 keeps HF's upcast numerics.
  Compute compute = Compute::kF32;
  bool load_tokenizer = true;  // read tokenizer.json when the directory has one
  void (*progress)(uint64_t done_bytes, uint64_t total_bytes) = nullptr;
};

// One sequence's place in the KV cache. Create with Model::new_sequence-free default
// construction; hand back with Model::release.
struct Sequence {
  std::vector<int32_t> tokens;       // every token whose K/V is cached, in order
  std::vector<int32_t> block_table;  // its KV pages
};

// Receives the residual stream after the embedding (index 0) and after each layer (1..L;
// the last one after the final norm, as HF's output_hidden_states). Rows are the pass's.
using HiddenSink = std::function<void(int64_t index, ConstRows h)>;

class Model {
 public:
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const LoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  // nullptr when the directory has no tokenizer.json (or load_tokenizer was false).
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  Backend& backend() { return *backend_; }
  // Runs the passes through `b` instead of the model's own backend (e.g. a ProfilingBackend
  // wrapping it); nullptr restores the own one. `b` must share the own backend's memory.
  void route_ops_through(Backend* b) { active_ = b != nullptr ? b : backend_.get(); }
  ThreadPool& pool() { return *pool_; }
  int64_t max_rows() const { return max_rows_; }
  int64_t vocab_size() const { return config_.vocab_size; }
  // The most tokens one sequence can hold: the rope table and KV capacity bound it.
  int64_t context_limit() const { return context_; }
  const KvPool& kv_pool() const { return *kv_; }
  // Bytes of weights the decode step reads per token (for roofline figures).
  uint64_t weight_bytes() const { return weight_bytes_; }

  // Appends `ids` to `seq`. logits: [ids.size(), V] when all_logits, else [1, V] for the
  // last token. Throws (leaving seq unchanged) on ids outside the vocabulary or a sequence
  // that would outgrow context_limit().
  void prefill(Sequence& seq, std::span<const int32_t> ids, std::span<float> logits,
               bool all_logits = false, const HiddenSink* sink = nullptr);
  // Appends tokens[i] to *seqs[i] for every i, in one pass; logits: [n, V].
  void decode(std::span<Sequence* const> seqs, std::span<const int32_t> tokens,
              std::span<float> logits);
  // Returns the sequence's pages to the pool and empties it.
  void release(Sequence& seq);

 private:
  Model() = default;
  void check_ids(std::span<const int32_t> ids) const;
  // The layers over one chunk, then logits for rows [first_logit_row, n) into `logits`;
  // logits == nullptr skips the final norm and lm_head (a chunk that only fills the cache).
  void run(const ForwardContext& ctx, std::span<const int32_t> ids, int64_t first_logit_row,
           float* logits, const HiddenSink* sink);

  std::filesystem::path dir_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Backend> backend_;
  Backend* active_ = nullptr;  // what the passes call: backend_ or a decorator of it
  DenseModelWeights weights_;
  std::vector<DenseLayer> layers_;
  RopeTable rope_;
  std::unique_ptr<KvPool> kv_;
  int64_t max_rows_ = 0;
  int64_t context_ = 0;
  uint64_t weight_bytes_ = 0;

  // Per-pass memory, sized once for max_rows_.
  Buffer scratch_buffer_;
  DenseScratch scratch_;
  Rows h_, delta_;
  std::vector<int32_t> positions_;
  std::vector<int64_t> slots_;
  std::vector<KvPageTable> tables_;
};

// RopeTable inputs from a model's config.
RopeTableConfig rope_table_config(const ModelConfig& config);

}  // namespace metrale
