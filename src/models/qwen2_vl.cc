// qwen2_vl, qwen2_5_vl and qwen3_vl (transformers' modeling_qwen2_vl / _qwen2_5_vl / _qwen3_vl):
// the language model
// of Qwen2-VL and Qwen2.5-VL is Qwen2's decoder
// (q/k/v with bias, o_proj without, a dense SwiGLU MLP) with a sectioned multimodal rope
// (mrope_section: the first frequencies follow t, the next h, the rest w). Checkpoints ship it
// as transformers writes them: the language model under model.* (model.language_model.* in
// checkpoints re-saved with the in-memory names) and lm_head.weight, the vision tower under
// visual.* (or model.visual.*), which the engine loads separately (engine/vision_encoder.h).
// Qwen3-VL's is Qwen3's decoder (q/k norms, no biases) with the interleaved multimodal rope,
// under model.language_model.*; the engine sets Architecture::deepstack from its tower.
// Qwen3-VL-MoE's (qwen3_vl_moe) is the same with qwen3_moe's sparse layers
// (ModelConfig::is_moe_layer), whose experts ship fused (MoeFfn::load).
#include "layers/attention.h"
#include "layers/ffn.h"
#include "models/decoder_stack.h"
#include "models/families.h"

namespace metrale {

std::unique_ptr<Architecture> build_qwen2_vl(const ModelConfig& c, TensorLoader& l) {
  const bool nested = l.has("model.language_model.embed_tokens.weight");
  return build_decoder_stack(
      c, l,
      {.prefix = nested ? "model.language_model." : "model.",
       .unloaded = {"visual.", "model.visual."},
       .mixer = [&](int64_t i,
                    const std::string& p) { return GqaAttention::load(c, i, l, p + "self_attn."); },
       .ffn = [&](int64_t i, const std::string& p) -> std::unique_ptr<Ffn> {
         if (c.is_moe_layer(i)) return MoeFfn::load(c, l, p + "mlp.");
         return DenseFfn::load(c, l, p + "mlp.", c.intermediate_size);
       }});
}

}  // namespace metrale
