// glm4_moe (transformers' modeling_glm4_moe, GLM-4.5): GQA attention with partial rotary
// (partial_rotary_factor of head_dim, rotate_half), q/k/v bias when attention_bias and per-head
// qk-norm when use_qk_norm (layers/attention.h); the FFN routes like DeepSeek-V3 (sigmoid scores
// with a correction bias, group-limited top-k, routed_scaling_factor, ungated shared experts;
// ffn.h) after first_k_dense_replace dense layers. Its multi-token-prediction layers
// (model.layers.<num_hidden_layers + i>.*) are recognised and not loaded by the target, as in
// HF; the speculative drafter loads the first (build_glm4_moe_mtp: a full-attention GQA layer,
// vLLM's glm4_moe_mtp.py).
#include "layers/attention.h"
#include "layers/ffn.h"
#include "models/decoder_stack.h"
#include "models/families.h"
#include "models/mtp_layers.h"

namespace metrale {

namespace {

// Layer i's FFN (`p`: its "mlp." prefix): dense below first_k_dense_replace, else MoE.
std::unique_ptr<Ffn> glm_ffn(const ModelConfig& c, TensorLoader& l, int64_t i,
                             const std::string& p) {
  if (c.is_moe_layer(i)) return MoeFfn::load(c, l, p);
  return DenseFfn::load(c, l, p, c.intermediate_size);
}

}  // namespace

std::unique_ptr<Architecture> build_glm4_moe(const ModelConfig& c, TensorLoader& l) {
  return build_decoder_stack(
      c, l,
      {.unloaded = mtp_layer_prefixes(c),
       .mixer = [&](int64_t i, const std::string& p) -> std::unique_ptr<Mixer> {
         return GqaAttention::load(c, i, l, p + "self_attn.");
       },
       .ffn = [&](int64_t i, const std::string& p) { return glm_ffn(c, l, i, p + "mlp."); }});
}

std::unique_ptr<MtpLayer> build_glm4_moe_mtp(const ModelConfig& c, TensorLoader& l) {
  return build_nextn_mtp(
      c, l,
      {.mixer = [&](const std::string& p) -> std::unique_ptr<Mixer> {
         return GqaAttention::load(c, LayerKind::kFullAttention, l, p);
       },
       .ffn = [&](int64_t i, const std::string& p) { return glm_ffn(c, l, i, p); }});
}

}  // namespace metrale
