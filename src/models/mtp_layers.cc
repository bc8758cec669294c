#include "models/mtp_layers.h"

#include <cstring>

#include "core/error.h"
#include "models/families.h"
#include "models/registry.h"

namespace metrale {

namespace {

// Whether checkpoint tensors `a` and `b` hold the same values (dtype, shape and bytes).
bool same_tensor(const TensorLoader& l, const std::string& a, const std::string& b) {
  const CheckpointTensor* x = l.checkpoint().find(a);
  const CheckpointTensor* y = l.checkpoint().find(b);
  if (x == nullptr || y == nullptr) return false;
  const TensorView vx = x->view(), vy = y->view();
  if (vx.dtype != vy.dtype || vx.shape != vy.shape) return false;
  const auto bx = x->bytes(), by = y->bytes();
  return bx.size() == by.size() && std::memcmp(bx.data(), by.data(), bx.size()) == 0;
}

}  // namespace

std::unique_ptr<MtpLayer> build_nextn_mtp(const ModelConfig& c, TensorLoader& l,
                                          const NextnMtpParts& parts) {
  METRALE_CHECK(c.n_mtp_layers > 0, c.source,
                ": the MTP drafter needs the checkpoint's multi-token-prediction layers, but the "
                "config declares none (num_nextn_predict_layers: 0)");
  const int64_t H = c.hidden_size, V = c.vocab_size, index = c.n_layers;
  const std::string p = "model.layers." + std::to_string(index) + ".";
  MtpLayerParts m;
  m.prefix = p;
  m.subtree = mtp_layer_prefixes(c);
  m.embed_norm = load_norm(l, c, p + "enorm.weight", H);
  m.hidden_norm = load_norm(l, c, p + "hnorm.weight", H);
  m.eh_proj = load_linear(l, p + "eh_proj", H, 2 * H, false);
  Norm input_norm = load_norm(l, c, p + "input_layernorm.weight", H);
  std::unique_ptr<Mixer> mixer = parts.mixer(p + "self_attn.");
  Norm post_norm = load_norm(l, c, p + "post_attention_layernorm.weight", H);
  m.layer = std::make_unique<DecoderLayer>(std::move(input_norm), std::move(mixer),
                                           std::move(post_norm), parts.ffn(index, p + "mlp."));
  l.ignore(p + "self_attn.rotary_emb.inv_freq");
  m.head_norm = load_norm(l, c, p + "shared_head.norm.weight", H);
  const std::string head = p + "shared_head.head";
  const std::string target_head =
      c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  if (l.has(head + ".weight") && !same_tensor(l, head + ".weight", target_head)) {
    m.head = Linear::separate({l.linear(head, V, H, false)}, {{head, 0, V}});
  } else {
    l.ignore(head + ".weight");
  }
  l.ignore(p + "embed_tokens.weight");
  for (int64_t i = 1; i < c.n_mtp_layers; ++i)
    l.ignore_prefix("model.layers." + std::to_string(index + i) + ".");
  return std::make_unique<MtpLayer>(std::move(m));
}

std::unique_ptr<MtpLayer> load_mtp_layer(const ModelConfig& c, TensorLoader& l) {
  const ArchitectureEntry* family = find_architecture(c.model_type);
  METRALE_CHECK(family != nullptr && family->build_mtp != nullptr, c.source, ": model_type '",
                c.model_type, "' has no MTP drafter in this build");
  std::unique_ptr<MtpLayer> layer = family->build_mtp(c, l);
  // The target's tensors are not the drafter's business; the MTP layers' must all be claimed.
  for (const CheckpointTensor& t : l.checkpoint().tensors()) {
    bool in_mtp = false;
    for (const std::string& prefix : layer->subtree())
      in_mtp = in_mtp || t.name().starts_with(prefix);
    if (!in_mtp) l.ignore(std::string(t.name()));
  }
  l.check_all_claimed();
  return layer;
}

}  // namespace metrale
