// qwen3_moe (transformers' modeling_qwen3_moe): qwen3's attention (GQA, per-head qk-norm) and,
// per layer, either a softmax-routed top-k mixture of gated-MLP experts or a dense MLP.
// A layer is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers
// (ModelConfig::is_moe_layer). Experts load from either tensor layout (ffn.h).
#include "core/error.h"
#include "layers/attention.h"
#include "layers/ffn.h"
#include "models/decoder_stack.h"
#include "models/families.h"

namespace metrale {

std::unique_ptr<Architecture> build_qwen3_moe(const ModelConfig& c, TensorLoader& l) {
  return build_decoder_stack(
      c, l,
      {.mixer = [&](int64_t i,
                    const std::string& p) { return GqaAttention::load(c, i, l, p + "self_attn."); },
       .ffn = [&](int64_t i, const std::string& p) -> std::unique_ptr<Ffn> {
         if (c.is_moe_layer(i)) return MoeFfn::load(c, l, p + "mlp.");
         return DenseFfn::load(c, l, p + "mlp.", c.intermediate_size);
       }});
}

}  // namespace metrale
