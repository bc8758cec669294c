// glm4_moe (transformers' modeling_glm4_moe, GLM-4.5): GQA attention with partial rotary
// (partial_rotary_factor of head_dim, rotate_half), q/k/v bias when attention_bias and per-head
// qk-norm when use_qk_norm (layers/attention.h); the FFN routes like DeepSeek-V3 (sigmoid scores
// with a correction bias, group-limited top-k, routed_scaling_factor, ungated shared experts;
// ffn.h) after first_k_dense_replace dense layers. Its multi-token-prediction layers
// (model.layers.<num_hidden_layers + i>.*) are recognised and not loaded, as in HF.
#include "layers/attention.h"
#include "layers/ffn.h"
#include "models/decoder_stack.h"
#include "models/families.h"

namespace metrale {

std::unique_ptr<Architecture> build_glm4_moe(const ModelConfig& c, TensorLoader& l) {
  return build_decoder_stack(
      c, l,
      {.unloaded = mtp_layer_prefixes(c),
       .mixer = [&](int64_t i, const std::string& p) -> std::unique_ptr<Mixer> {
         return GqaAttention::load(c, i, l, p + "self_attn.");
       },
       .ffn = [&](int64_t i, const std::string& p) -> std::unique_ptr<Ffn> {
         if (c.is_moe_layer(i)) return MoeFfn::load(c, l, p + "mlp.");
         return DenseFfn::load(c, l, p + "mlp.", c.intermediate_size);
       }});
}

}  // namespace metrale
