// glm4v (transformers' modeling_glm4v, Glm4vTextModel): GLM-4's dense decoder with sandwich
// norms (input_layernorm, attention, post_self_attn_layernorm, residual add;
// post_attention_layernorm, MLP, post_mlp_layernorm, residual add), q/k/v with bias and o_proj
// without, a fused gate_up_proj (gate rows first), and a sectioned multimodal rope over the
// first partial_rotary_factor of each head that rotates adjacent pairs (rotate_half_llm after
// repeat_interleave(2)). Checkpoints ship it under model.language_model.* with lm_head.weight;
// the vision tower under model.visual.* is loaded by the engine (engine/vision_encoder.h).
// glm4v_moe (modeling_glm4v_moe, GLM-4.5V): the same tower beside glm4_moe's decoder (no
// sandwich norms; sigmoid-routed experts after first_k_dense_replace dense layers, ffn.h) with
// the sectioned multimodal rope on rotate_half. HF loads no MTP layer for it: a published
// checkpoint's (model.layers.<n>.*, beside model.language_model.*) is recognised and not loaded.
#include "layers/attention.h"
#include "layers/ffn.h"
#include "models/decoder_stack.h"
#include "models/families.h"

namespace metrale {

std::unique_ptr<Architecture> build_glm4v(const ModelConfig& c, TensorLoader& l) {
  return build_decoder_stack(
      c, l,
      {.prefix = "model.language_model.",
       .unloaded = {"model.visual."},
       .sandwich_norms = true,
       .mixer = [&](int64_t i,
                    const std::string& p) { return GqaAttention::load(c, i, l, p + "self_attn."); },
       .ffn = [&](int64_t, const std::string& p) -> std::unique_ptr<Ffn> {
         return DenseFfn::load(c, l, p + "mlp.", c.intermediate_size);
       }});
}

std::unique_ptr<Architecture> build_glm4v_moe(const ModelConfig& c, TensorLoader& l) {
  return build_decoder_stack(
      c, l,
      {.prefix = "model.language_model.",
       .unloaded = {"model.visual.", "model.layers."},
       .mixer = [&](int64_t i,
                    const std::string& p) { return GqaAttention::load(c, i, l, p + "self_attn."); },
       .ffn = [&](int64_t i, const std::string& p) -> std::unique_ptr<Ffn> {
         if (c.is_moe_layer(i)) return MoeFfn::load(c, l, p + "mlp.");
         return DenseFfn::load(c, l, p + "mlp.", c.intermediate_size);
       }});
}

}  // namespace metrale
