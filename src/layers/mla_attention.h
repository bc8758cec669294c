#pragma once
// Multi-head latent attention (DeepSeek-V2 / V3; transformers' DeepseekV3Attention), over a
// latent KV cache:
//   q = q_b_proj(q_a_layernorm(q_a_proj(x)))   or q_proj(x) when q_lora_rank is null
//       per head [q_nope (qk_nope_head_dim) | q_rope (qk_rope_head_dim)]
//   [c | k_rope] = kv_a_proj_with_mqa(x);  c = kv_a_layernorm(c)    (c: kv_lora_rank)
//   q_rope, k_rope = rope(q_rope, k_rope)   (rope_interleave: adjacent pairs)
// HF expands the cached latents with kv_b_proj into per-head keys [k_nope | k_rope] and values
// and runs softmax attention. Here only [c | k_rope] is cached per token (kv_lora_rank +
// qk_rope_head_dim values, one "head", keys only), and the expansion is folded in:
//   score = q_nope . (W_uk c) + q_rope . k_rope = (W_uk^T q_nope) . c + q_rope . k_rope
//   out_h = W_uv (sum_t p_t c_t)
// with W_uk / W_uv the key / value rows of kv_b_proj for head h, applied per head before and
// after the attention op (Backend::latent_attention), all heads in one Backend::linears call. Equal
// to HF's order up to f32 rounding; chunked prefill and decode read the same cache, so chunks do
// not change a result.
#include <memory>
#include <string>
#include <vector>

#include "layers/block.h"
#include "layers/linear.h"
#include "layers/norm.h"

namespace metrale {

class MlaAttention final : public Mixer {
 public:
  // Reads prefix + {q_a_proj, q_a_layernorm, q_b_proj | q_proj}, kv_a_proj_with_mqa,
  // kv_a_layernorm, kv_b_proj and o_proj; checks each against the config's MLA widths.
  static std::unique_ptr<MlaAttention> load(const ModelConfig& config, TensorLoader& loader,
                                            const std::string& prefix);

  void record(Graph& g, const BlockIo& io) const override;
  std::string describe() const override;
  uint64_t active_bytes_per_token() const override;
  // The latent and the roped key, keys only.
  KvShape kv_shape() const override { return {1, kv_rank_ + rope_dim_, true}; }
  // The uncompressed layout per token: every head's expanded key and value.
  KvShape uncompressed_kv_shape() const { return {n_heads_, nope_dim_ + rope_dim_ + v_dim_, true}; }

 private:
  Linear q_a_;      // [q_lora_rank, H] q_a_proj (q_lora_rank set)
  Norm q_a_norm_;   // [q_lora_rank]
  Linear q_;        // [n_heads * (nope + rope), q_lora_rank | H] q_b_proj or q_proj
  Linear kv_a_;     // [kv_lora_rank + rope, H] kv_a_proj_with_mqa
  Norm kv_a_norm_;  // [kv_lora_rank]
  // bf16 when kv_b_proj's values all are (a bf16 checkpoint), else f32.
  std::vector<WeightTensor> k_absorb_;  // per head [kv_lora_rank, nope]: W_uk^T
  std::vector<WeightTensor> v_up_;      // per head [v, kv_lora_rank]: W_uv
  Linear o_;                            // [H, n_heads * v] o_proj
  int64_t n_heads_ = 0, kv_rank_ = 0, nope_dim_ = 0, rope_dim_ = 0, v_dim_ = 0;
  float scale_ = 0.0f;
  bool pairs_ = false;  // rope_interleave
};

}  // namespace metrale
