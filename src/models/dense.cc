// llama, mistral, qwen2, qwen3: GQA attention (q/k/v bias where the config says so, per-head
// qk-norm for qwen3, sliding windows where the config sets them) and a dense gated MLP in
// every layer.
#include "layers/attention.h"
#include "layers/ffn.h"
#include "models/decoder_stack.h"
#include "models/families.h"

namespace metrale {

std::unique_ptr<Architecture> build_dense_decoder(const ModelConfig& c, TensorLoader& l) {
  return build_decoder_stack(
      c, l,
      {.mixer = [&](int64_t i,
                    const std::string& p) { return GqaAttention::load(c, i, l, p + "self_attn."); },
       .ffn =
           [&](int64_t, const std::string& p) {
             return DenseFfn::load(c, l, p + "mlp.", c.intermediate_size);
           }});
}

}  // namespace metrale
