#pragma once
// A multi-token-prediction layer, as DeepSeek-V3 / GLM-4.5 checkpoints ship it after their
// decoder layers (model.layers.<num_hidden_layers + i>.*) and Qwen3-Next beside them (mtp.*),
// and as vLLM runs it for speculative decoding (vllm/model_executor/models/deepseek_mtp.py,
// glm4_moe_mtp.py, qwen3_next_mtp.py; the fixture script tools/fixtures/models/mtp_fixtures.py
// cites them). One drafter row of key k reads the token t_{k+1} and a hidden row h_k (the
// target's after its final norm, or the drafter's own previous output when drafts chain):
//   e = embed(t_{k+1})                       (the target's embedding; DeepSeek / GLM: zero for
//                                             key 0)
//   x = eh_proj([enorm(e) | hnorm(h_k)])      [2H] -> [H], the embedding half first (Qwen3-Next:
//                                             fc, pre_fc_norm_embedding, pre_fc_norm_hidden)
//   y = layer(x)                              one decoder layer of the family's kind, with its
//                                             own KV (layer index 0 of the drafter's pool)
//   logits = head(norm(y))                    shared_head.norm / mtp.norm; head:
//                                             shared_head.head, or the target's lm_head
// The next chained draft reads y itself (DeepSeek / GLM: the layer's residual stream, before
// any norm) or norm(y) (Qwen3-Next, whose MTP forward returns its normed output).
//
// record() writes that pass as a Graph over the caller's embedding table and head, so the
// drafter engine (engine/mtp_proposer.h) runs it like the target's pass: ragged rows of many
// sequences, their KV pages, the wanted rows' logits.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/decoder_layer.h"
#include "layers/linear.h"
#include "layers/norm.h"

namespace metrale {

// The external buffers of a recorded MTP pass (Executor::bind per pass).
struct MtpIo {
  BufferId hidden_in = -1;  // [rows, H] each row's hidden h_k
  BufferId h = -1;          // [rows, H] the residual stream; after the pass each row's output y
  BufferId delta = -1;      // [rows, H]
  BufferId zeros = -1;      // [injected, H] zero rows for the key-0 rows' embeddings (or -1)
  BufferId normed = -1;     // [wanted, H] norm(y), the head's input
  BufferId logits = -1;     // [wanted, V]
};

struct MtpLayerParts {
  std::string prefix;  // "model.layers.3.", "mtp."
  // Where the family's MTP tensors live (every MTP layer's, loaded or not): all of them must be
  // accounted for.
  std::vector<std::string> subtree;
  Norm embed_norm;   // [H] enorm / pre_fc_norm_embedding
  Norm hidden_norm;  // [H] hnorm / pre_fc_norm_hidden
  Linear eh_proj;    // [H, 2H] eh_proj / fc
  std::unique_ptr<DecoderLayer> layer;
  Norm head_norm;              // [H] shared_head.norm / mtp.norm
  Linear head;                 // [V, H] shared_head.head; empty: the target's lm_head
  bool zero_first_key = true;  // key 0's embedding zeroed (DeepSeek / GLM)
  bool chain_normed = false;   // drafts chain on norm(y), not y (Qwen3-Next)
};

class MtpLayer {
 public:
  explicit MtpLayer(MtpLayerParts parts);

  // Records one drafter pass into `g` (empty) over the target's embedding table `embed` [V, H]
  // and, when the layer has no head of its own, the target's `lm_head` (both outlive the graph).
  MtpIo record(Graph& g, const WeightTensor& embed, const Linear& lm_head) const;

  const std::string& prefix() const { return parts_.prefix; }
  const std::vector<std::string>& subtree() const { return parts_.subtree; }
  bool zero_first_key() const { return parts_.zero_first_key; }
  bool chain_normed() const { return parts_.chain_normed; }
  const DecoderLayer& layer() const { return *parts_.layer; }
  bool own_head() const { return !parts_.head.empty(); }
  // One line for `metrale inspect` and logs.
  std::string describe() const;
  // Weight bytes one drafter row reads (the layer's active bytes, eh_proj and the head).
  uint64_t active_bytes_per_token(const Linear& lm_head) const;

 private:
  MtpLayerParts parts_;
};

}  // namespace metrale
