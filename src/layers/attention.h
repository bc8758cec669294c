#pragma once
// GQA softmax attention over the paged KV cache, as llama / mistral / qwen2 / qwen3 /
// qwen3_moe compute it:
//   q|k|v = x Wqkv (+ b); q, k = per-head RMSNorm (qk-norm families); q, k = rope(q, k);
//   store k, v; o = attention(q, cache) Wo
// Room for variants: a gated output (Qwen3-Next) or partial rope are fields here, MLA is
// its own Mixer.
#include <memory>
#include <string>

#include "layers/block.h"
#include "layers/linear.h"
#include "layers/norm.h"

namespace metrale {

class GqaAttention final : public Mixer {
 public:
  // Reads prefix + {q,k,v,o}_proj (and q_norm / k_norm when config.qk_norm).
  static std::unique_ptr<GqaAttention> load(const ModelConfig& config, int64_t layer,
                                            TensorLoader& loader, const std::string& prefix);

  void forward(const ForwardContext& ctx, const LayerState& state, ConstRows x, Rows out,
               Workspace ws) const override;
  size_t workspace_floats(int64_t max_rows) const override;
  std::string describe() const override;
  uint64_t active_bytes_per_token() const override;

  const Linear& qkv() const { return qkv_; }
  const Linear& o() const { return o_; }

 private:
  Linear qkv_;   // [Q + 2 KV, H] q_proj | k_proj | v_proj
  Linear o_;     // [H, Q] o_proj
  Norm q_norm_;  // [D] qk-norm families only
  Norm k_norm_;  // [D]
  AttentionShape shape_;
};

}  // namespace metrale
