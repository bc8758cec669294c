#pragma once
// GQA softmax attention over the paged KV cache, as llama / mistral / qwen2 / qwen3 /
// qwen3_moe compute it:
//   q|k|v = x Wqkv (+ b); q, k = per-head RMSNorm (qk-norm families); q, k = rope(q, k);
//   store k, v; o = attention(q, cache) Wo
// Variants are fields here: partial rope (the rope table's rotary_dim < head_dim rotates the
// first rotary_dim values of each head; GLM-4V rotates adjacent pairs there) and the gated output
// of Qwen3-Next / Qwen3.5, where q_proj emits per head [query | gate] and o = (attention *
// sigmoid(gate)) Wo. MLA is its own Mixer.
#include <memory>
#include <string>

#include "layers/block.h"
#include "layers/linear.h"
#include "layers/norm.h"

namespace metrale {

class GqaAttention final : public Mixer {
 public:
  // Reads prefix + {q,k,v,o}_proj (and q_norm / k_norm when config.qk_norm). With
  // config.attention_output_gate, q_proj is [n_heads * 2 * head_dim, H], each head's query
  // rows then its gate rows; they are regrouped at load into all queries, then all gates.
  static std::unique_ptr<GqaAttention> load(const ModelConfig& config, int64_t layer,
                                            TensorLoader& loader, const std::string& prefix);
  // The same for a layer outside the decoder stack (an MTP layer), whose kind is given.
  static std::unique_ptr<GqaAttention> load(const ModelConfig& config, LayerKind kind,
                                            TensorLoader& loader, const std::string& prefix);

  void record(Graph& g, const BlockIo& io) const override;
  std::string describe() const override;
  uint64_t active_bytes_per_token() const override;
  KvShape kv_shape() const override { return {shape_.n_kv_heads, shape_.head_dim, false}; }
  // Ungated attention only: a gated q_proj's rows are reordered at load (q | gate).
  void lora_sites(LoraSites& out) override {
    if (output_gate_) return;
    out.linears.push_back(&qkv_);
    out.linears.push_back(&o_);
  }

  const Linear& qkv() const { return qkv_; }
  const Linear& o() const { return o_; }

 private:
  Linear qkv_;   // [Q + 2 KV, H] q_proj | k_proj | v_proj; gated: [2 Q + 2 KV, H] q | gate | k | v
  Linear o_;     // [H, Q] o_proj
  Norm q_norm_;  // [D] qk-norm families only
  Norm k_norm_;  // [D]
  AttentionShape shape_;
  bool output_gate_ = false;
  bool pairs_ = false;  // GLM-4V: rope rotates adjacent pairs (config.rope.pairs_interleaved)
};

}  // namespace metrale
