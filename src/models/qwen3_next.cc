// qwen3_next, qwen3_5 and qwen3_5_moe (transformers' modeling_qwen3_next / _qwen3_5 /
// _qwen3_5_moe), text-only (*ForCausalLM: qwen3_next, qwen3_5_text, qwen3_5_moe_text) or as
// the language model of a vision-language checkpoint (qwen3_5, qwen3_5_moe). Layers
// interleave two mixers, as config.layer_types says:
//  - linear_attention: Gated DeltaNet (layers/gated_delta_net.h), a recurrent state per
//    sequence in the engine's state pool;
//  - full_attention: GQA with per-head qk-norm, partial rope and a sigmoid-gated output
//    (layers/attention.h).
// The FFN is a softmax top-k MoE with a sigmoid-gated shared expert (qwen3_next: where
// decoder_sparse_step / mlp_only_layers say, else a dense MLP; qwen3_5_moe: every layer) or a
// dense MLP (qwen3_5). Every RMSNorm of the decoder scales by (1 + w) (zero-centred weights).
//
// Qwen3.5's rope is multimodal (rope_parameters.mrope_section, frequencies interleaved t, h,
// w): each frequency slot takes its angle from one of three position ids. For text every token
// has t == h == w == its position, so the interleaved table is the plain 1-D one, which is
// what runs here; image and video positions would come with the vision tower, not loaded.
//
// Recognised and not loaded: the vision tower of a vision-language checkpoint
// (model.visual.*) and the multi-token-prediction layers (mtp.*), which HF also drops. The
// speculative drafter loads Qwen3-Next's first MTP layer (build_qwen3_next_mtp, as vLLM's
// qwen3_next_mtp.py builds it): mtp.{pre_fc_norm_embedding, pre_fc_norm_hidden, fc,
// layers.0 (a gated full-attention layer whose FFN follows the rule at index 0, the number
// vLLM reads from its prefix), norm}, embedding and head the target's; its drafts chain on the
// normed output, and no row's embedding is zeroed.
#include "core/error.h"
#include "layers/attention.h"
#include "layers/ffn.h"
#include "layers/gated_delta_net.h"
#include "models/decoder_stack.h"
#include "models/families.h"
#include "models/mtp_layers.h"

namespace metrale {

std::unique_ptr<Architecture> build_qwen3_next(const ModelConfig& c, TensorLoader& l) {
  const bool vlm = c.model_type == "qwen3_5" || c.model_type == "qwen3_5_moe";
  return build_decoder_stack(
      c, l,
      {.prefix = vlm ? "model.language_model." : "model.",
       .unloaded = {"model.visual.", "mtp."},
       .mixer = [&](int64_t i, const std::string& p) -> std::unique_ptr<Mixer> {
         const bool linear = c.layer_kind(i) == LayerKind::kLinearAttention;
         // layer_types against the tensors, so a wrong list names the layer, not a tensor.
         const std::string other =
             p + (linear ? "self_attn.o_proj.weight" : "linear_attn.out_proj.weight");
         METRALE_CHECK(!l.has(other), c.source, ": layer_types says layer ", i, " is ",
                       layer_kind_name(c.layer_kind(i)), " but the checkpoint has '", other, "'");
         if (linear) return GatedDeltaNet::load(c, i, l, p + "linear_attn.");
         return GqaAttention::load(c, i, l, p + "self_attn.");
       },
       .ffn = [&](int64_t i, const std::string& p) -> std::unique_ptr<Ffn> {
         if (c.is_moe_layer(i)) return MoeFfn::load(c, l, p + "mlp.");
         return DenseFfn::load(c, l, p + "mlp.", c.intermediate_size);
       }});
}

std::unique_ptr<MtpLayer> build_qwen3_next_mtp(const ModelConfig& c, TensorLoader& l) {
  const int64_t H = c.hidden_size;
  // vLLM: num_mtp_layers = getattr(config, "num_nextn_predict_layers", 1); the Hub's Qwen3-Next
  // config does not say.
  const int64_t n_mtp = c.n_mtp_layers > 0 ? c.n_mtp_layers : 1;
  const std::string p = "mtp.", layer = p + "layers.0.";
  MtpLayerParts m;
  m.prefix = p;
  m.subtree = {p};
  m.embed_norm = load_norm(l, c, p + "pre_fc_norm_embedding.weight", H);
  m.hidden_norm = load_norm(l, c, p + "pre_fc_norm_hidden.weight", H);
  m.eh_proj = load_linear(l, p + "fc", H, 2 * H, false);
  Norm input_norm = load_norm(l, c, layer + "input_layernorm.weight", H);
  std::unique_ptr<Mixer> mixer =
      GqaAttention::load(c, LayerKind::kFullAttention, l, layer + "self_attn.");
  Norm post_norm = load_norm(l, c, layer + "post_attention_layernorm.weight", H);
  std::unique_ptr<Ffn> ffn = c.is_moe_layer(0)
                                 ? std::unique_ptr<Ffn>(MoeFfn::load(c, l, layer + "mlp."))
                                 : DenseFfn::load(c, l, layer + "mlp.", c.intermediate_size);
  m.layer = std::make_unique<DecoderLayer>(std::move(input_norm), std::move(mixer),
                                           std::move(post_norm), std::move(ffn));
  l.ignore(layer + "self_attn.rotary_emb.inv_freq");
  m.head_norm = load_norm(l, c, p + "norm.weight", H);
  m.zero_first_key = false;
  m.chain_normed = true;
  for (int64_t i = 1; i < n_mtp; ++i) l.ignore_prefix(p + "layers." + std::to_string(i) + ".");
  return std::make_unique<MtpLayer>(std::move(m));
}

}  // namespace metrale
