// deepseek_v3 (transformers' modeling_deepseek_v3): multi-head latent attention with a latent KV
// cache (layers/mla_attention.h) and, per layer, a dense MLP (layers [0, first_k_dense_replace))
// or a mixture of experts routed by sigmoid scores with a correction bias, group-limited top-k,
// optional renormalisation and routed_scaling_factor, plus ungated shared experts (ffn.h).
//
// The target recognises and does not load the multi-token-prediction layers a DeepSeek-V3
// checkpoint ships after its decoder layers (model.layers.<num_hidden_layers + i>.*, i <
// num_nextn_predict_layers; DeepSeek-V3's layer 61), which HF's DeepseekV3ForCausalLM drops as
// well; the speculative drafter loads the first (build_deepseek_v3_mtp: an MLA layer whose FFN
// follows the same dense / MoE rule at its index, as vLLM's deepseek_mtp.py builds it).
#include "layers/ffn.h"
#include "layers/mla_attention.h"
#include "models/decoder_stack.h"
#include "models/families.h"
#include "models/mtp_layers.h"

namespace metrale {

std::vector<std::string> mtp_layer_prefixes(const ModelConfig& c) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < c.n_mtp_layers; ++i)
    out.push_back("model.layers." + std::to_string(c.n_layers + i) + ".");
  return out;
}

namespace {

// Layer i's FFN (`p`: its "mlp." prefix): dense below first_k_dense_replace, else MoE.
std::unique_ptr<Ffn> deepseek_ffn(const ModelConfig& c, TensorLoader& l, int64_t i,
                                  const std::string& p) {
  if (c.is_moe_layer(i)) return MoeFfn::load(c, l, p);
  return DenseFfn::load(c, l, p, c.intermediate_size);
}

}  // namespace

std::unique_ptr<Architecture> build_deepseek_v3(const ModelConfig& c, TensorLoader& l) {
  return build_decoder_stack(
      c, l,
      {.unloaded = mtp_layer_prefixes(c),
       .mixer = [&](int64_t, const std::string& p) -> std::unique_ptr<Mixer> {
         return MlaAttention::load(c, l, p + "self_attn.");
       },
       .ffn = [&](int64_t i, const std::string& p) { return deepseek_ffn(c, l, i, p + "mlp."); }});
}

std::unique_ptr<MtpLayer> build_deepseek_v3_mtp(const ModelConfig& c, TensorLoader& l) {
  return build_nextn_mtp(
      c, l,
      {.mixer = [&](const std::string& p) -> std::unique_ptr<Mixer> {
         return MlaAttention::load(c, l, p);
       },
       .ffn = [&](int64_t i, const std::string& p) { return deepseek_ffn(c, l, i, p); }});
}

}  // namespace metrale
