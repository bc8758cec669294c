#pragma once
// MtpProposer: the multi-token-prediction drafter a DeepSeek-V3 / GLM-4.5 / Qwen3-Next checkpoint
// ships (layers/mtp_layer.h), as a DraftProposer (speculative/draft_proposer.h). It loads the first
// MTP layer from the target's checkpoint (any weight format the target loads), embeds with the
// target's embedding and, unless the layer ships its own shared_head.head, scores with the
// target's lm_head; it keeps its own paged KV pool holding only that layer, and runs its pass
// as the target runs its own (a recorded Graph, ragged rows of many sequences).
//
// Rows follow draft_proposer.h's keys: the row of key k reads (t_{k+1}, the target's hidden at
// position k after its final norm) and is stored at drafter KV index k; it rotates at RoPE
// position k + 1 (vLLM places it at k, which rotary attention cannot tell apart: only
// position differences enter the scores). DeepSeek / GLM: key 0's embedding is zeroed, as
// vLLM's drafter zeroes position 0's.
//
// Per sequence:
//   prefill_drafter  computes keys 0..P-2 from the prompt and the target's prompt hiddens;
//   start_drafter    (drafter prefill off) computes none: the sequence's rows start at key P-1,
//                    the first propose's, stored at KV index 0 (key k at index k - (P - 1),
//                    rotating at k - P + 2: the same scores, as only position differences
//                    enter them) — the drafter attends over the rows it computed itself;
//   propose          adds key position - 1 (last, hidden), whose argmax is the first draft, then
//                    chains: draft j + 1 is the argmax of the row (draft j, the drafter's own
//                    output for draft j — MtpLayer's chained row) — vLLM's "mtp" chaining;
//   after_verify     keeps only the row computed from the target's hidden (exact mode:
//                    speculative::drafter_trim with exact = true), so the rows of accepted
//                    drafts are recomputed from the target's own hiddens:
//   catchup          appends those rows (keys position .. position + accepted - 1: the accepted
//                    drafts and the target's hiddens of their verify rows), or any rows decoded
//                    without the drafter. They are computed with the next propose, in its first
//                    pass (one pass for the catch-up rows and the first draft of every sequence).
// A propose whose first key is past the rows held (an accepted span not caught up) is an error
// naming the missing keys; one before them rolls the drafter back. propose(n = 0) records
// its row and computes it with the next propose.
//
// Hidden rows (prefill, propose, catchup) are host memory, like StepItem::embeds.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/kv_pool.h"
#include "engine/model.h"
#include "graph/executor.h"
#include "graph/plan.h"
#include "layers/mtp_layer.h"
#include "speculative/draft_proposer.h"

namespace metrale {

struct MtpOptions {
  int64_t kv_tokens = 0;  // drafter rows over all sequences; 0: the target's KV capacity
                          // (enough for one sequence; many: mtp_kv_tokens)
  int64_t page_size = 0;  // 0: the target's
  int64_t max_rows = 0;   // most rows of one drafter pass; 0: the target's max_rows
  DType kv_dtype = DType::kF32;
  WeightPlacement placement = WeightPlacement::kCopy;
  // Trees: a runner-up token becomes a branch only where the drafter gives it at least this
  // probability (softmax of its logits row); 0: every node the shape has (EAGLE-2's point:
  // branch where the drafter is unsure, and spend no verify rows where it is sure). In [0, 1).
  float branch_min_prob = 0.0f;
};

// Drafter rows (add any a carry keeps beside them) that never run out while the target's KV pool
// holds `streams` sequences drafting up to `drafts` tokens each: a sequence's drafter holds at most
// its target tokens plus its drafts' rows, so the target's capacity plus, per sequence, the pages
// `drafts` rows may open.
int64_t mtp_kv_tokens(const Model& target, int64_t streams, int64_t drafts);

// Receives every row a drafter pass computes, when set (tests, tools): its sequence's state,
// its key, its logits [V] and the row a draft would chain on [H] (MtpLayer: y, or norm(y)),
// host memory on the CPU backend. With a trace set, every pass computes every row's logits.
using MtpTrace = std::function<void(const speculative::ProposerState& state, int64_t key,
                                    const float* logits, const float* out)>;

class MtpProposer final : public speculative::DraftProposer {
 public:
  // Loads `target`'s first MTP layer from its checkpoint. Throws an Error naming the checkpoint
  // when it has no MTP layers (or its family no drafter), naming the tensor when one is missing,
  // misshapen or unexpected; nothing is left half-loaded. `target` outlives the proposer.
  static std::unique_ptr<MtpProposer> load(Model& target, const MtpOptions& options = {});
  ~MtpProposer() override;

  std::string_view name() const override { return "mtp"; }
  bool needs_hidden() const override { return true; }
  int64_t hidden_size() const override { return hidden_; }

  const MtpLayer& layer() const { return *layer_; }
  // The drafter's own KV pages: one layer.
  const KvPool& kv_pool() const { return *kv_; }
  int64_t max_rows() const { return max_rows_; }
  const Graph& graph() const { return graph_; }
  void set_trace(MtpTrace trace) { trace_ = std::move(trace); }

  // The rows (keys) `state` holds, computed or waiting for the next propose (tests).
  static int64_t keys(const speculative::ProposerState& state);

 protected:
  std::unique_ptr<speculative::ProposerState> do_alloc_state() override;
  void do_prefill(speculative::ProposerState& state, std::span<const int32_t> prompt,
                  ConstRows hidden) override;
  void do_start(speculative::ProposerState& state, std::span<const int32_t> prompt) override;
  void do_propose(const speculative::ProposeArgs& args, std::vector<int32_t>& drafts) override;
  void do_propose_batch(std::span<const speculative::ProposeArgs> args,
                        std::span<std::vector<int32_t>> drafts) override;
  // Trees: the main chain as propose_batch drafts it; a main-chain node's (and the root's)
  // c-th child is the drafter's c-th best token at that row (ties: the lower id), kept when its
  // probability reaches MtpOptions::branch_min_prob. Nodes below a non-first child have no
  // drafter row to come from and are left out.
  void do_propose_tree_batch(std::span<const speculative::ProposeArgs> args,
                             const speculative::DraftTree& shape,
                             std::span<speculative::TreeDrafts> out) override;
  void do_after_verify(speculative::ProposerState& state, int64_t drafted,
                       int64_t accepted) override;
  void do_catchup(speculative::ProposerState& state, const speculative::CatchupRows& rows) override;
  void do_free(speculative::ProposerState& state) override;

 private:
  struct State;
  // One row of a drafter pass: its sequence, key and token, and its hidden input — host memory
  // (`host`) or a device row (`device`).
  struct PassRow {
    State* state = nullptr;
    int64_t key = 0;
    int32_t id = 0;
    const float* host = nullptr;
    const float* device = nullptr;
    bool want = false;
  };

  MtpProposer() = default;
  // Throws unless every id is inside the vocabulary (the base class checks >= 0).
  void check_ids(std::span<const int32_t> ids, std::string_view call) const;
  // Runs `rows` (at most max_rows, each sequence's rows consecutive and continuing what it
  // holds) as one pass; logits_ then holds the wanted rows', in order, and h_ every row's y.
  void run(std::span<const PassRow> rows);
  // The row drafts chain on for pass row `row`, wanted row `wanted` (MtpLayer::chain_normed).
  const float* chained(int64_t row, int64_t wanted) const;
  // Drops the state's rows from key `keys` on (pending first, then its KV).
  void truncate(State& s, int64_t keys);

  Model* target_ = nullptr;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<MtpLayer> layer_;
  std::vector<std::shared_ptr<const Buffer>> storage_;
  std::unique_ptr<KvPool> kv_;
  KvLayerView kv_view_;
  RopeTable rope_;
  DeviceFloats rope_cos_, rope_sin_;
  int64_t hidden_ = 0, vocab_ = 0, max_rows_ = 0, context_ = 0;

  Graph graph_;
  MtpIo io_;
  GraphPlan plan_;
  Buffer arena_;
  std::unique_ptr<Executor> executor_;
  MtpTrace trace_;

  // Per-pass memory, sized once for max_rows_.
  Buffer pass_buffer_;  // hidden_in | h | delta | zeros | normed, [max_rows, padded H] each
  Rows hidden_in_, h_, delta_, zeros_, normed_;
  std::vector<float> staging_;  // [max_rows, padded H] host rows on their way to hidden_in_
  std::vector<float> logits_;   // [max_rows, V]
  std::vector<int32_t> ids_, positions_, row_seq_, row_index_, want_, injected_rows_;
  std::vector<int64_t> slots_;
  std::vector<KvPageTable> tables_;
  std::vector<State*> seqs_;
  // Trees: the best ranks_ tokens of each drafted row, per sequence (do_propose_batch fills
  // them when ranks_ > 0): ranked_[i][j * ranks_ + c] is draft j + 1's c-th best.
  int64_t ranks_ = 0;
  std::vector<std::vector<int32_t>> ranked_;
  std::vector<std::vector<float>> ranked_prob_;  // the drafter's probability of each
  float branch_min_prob_ = 0.0f;
  Buffer chain_;  // [sequences, padded H] each proposing sequence's last output row
  int64_t chain_rows_ = 0;
};

}  // namespace metrale
