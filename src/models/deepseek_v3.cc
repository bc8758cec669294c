// deepseek_v3 (transformers' modeling_deepseek_v3): multi-head latent attention with a latent KV
// cache (layers/mla_attention.h) and, per layer, a dense MLP (layers [0, first_k_dense_replace))
// or a mixture of experts routed by sigmoid scores with a correction bias, group-limited top-k,
// optional renormalisation and routed_scaling_factor, plus ungated shared experts (ffn.h).
//
// Recognised and not loaded: the multi-token-prediction layers a DeepSeek-V3 checkpoint ships
// after its decoder layers (model.layers.<num_hidden_layers + i>.*, i < num_nextn_predict_layers;
// DeepSeek-V3's layer 61), which HF's DeepseekV3ForCausalLM drops as well.
#include "layers/ffn.h"
#include "layers/mla_attention.h"
#include "models/decoder_stack.h"
#include "models/families.h"

namespace metrale {

std::vector<std::string> mtp_layer_prefixes(const ModelConfig& c) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < c.n_mtp_layers; ++i)
    out.push_back("model.layers." + std::to_string(c.n_layers + i) + ".");
  return out;
}

std::unique_ptr<Architecture> build_deepseek_v3(const ModelConfig& c, TensorLoader& l) {
  return build_decoder_stack(
      c, l,
      {.unloaded = mtp_layer_prefixes(c),
       .mixer = [&](int64_t, const std::string& p) -> std::unique_ptr<Mixer> {
         return MlaAttention::load(c, l, p + "self_attn.");
       },
       .ffn = [&](int64_t i, const std::string& p) -> std::unique_ptr<Ffn> {
         if (c.is_moe_layer(i)) return MoeFfn::load(c, l, p + "mlp.");
         return DenseFfn::load(c, l, p + "mlp.", c.intermediate_size);
       }});
}

}  // namespace metrale
