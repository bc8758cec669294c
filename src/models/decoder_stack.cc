#include "models/decoder_stack.h"

#include "core/error.h"
#include "layers/norm.h"

namespace metrale {

std::unique_ptr<Architecture> build_decoder_stack(const ModelConfig& c, TensorLoader& l,
                                                  const DecoderStackParts& parts) {
  METRALE_CHECK(c.layer_kinds.size() == static_cast<size_t>(c.n_layers), c.source,
                ": layer kinds do not cover every layer");
  const int64_t H = c.hidden_size, V = c.vocab_size;
  auto a = std::make_unique<Architecture>();
  // A bare base model (Qwen3Model, no "model." prefix): what sentence-transformers saves for a
  // decoder used as an embedder (Qwen3-Embedding ships so), often without its lm_head.
  const bool bare = parts.prefix == "model." && !l.has("model.embed_tokens.weight") &&
                    l.has("embed_tokens.weight");
  const std::string m = bare ? "" : parts.prefix;
  a->embed = l.matrix(m + "embed_tokens.weight", V, H);
  a->layers.reserve(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = m + "layers." + std::to_string(i) + ".";
    Norm input_norm = load_norm(l, c, p + "input_layernorm.weight", H);
    std::unique_ptr<Mixer> mixer = parts.mixer(i, p);
    Norm post_norm = load_norm(l, c, p + "post_attention_layernorm.weight", H);
    a->layers.emplace_back(std::move(input_norm), std::move(mixer), std::move(post_norm),
                           parts.ffn(i, p));
    if (parts.sandwich_norms) {
      a->layers.back().set_sandwich_norms(load_norm(l, c, p + "post_self_attn_layernorm.weight", H),
                                          load_norm(l, c, p + "post_mlp_layernorm.weight", H));
    }
    // Buffers written by transformers < 4.31 for the rotary embedding; never weights.
    l.ignore(p + "self_attn.rotary_emb.inv_freq");
  }
  a->final_norm = load_norm(l, c, m + "norm.weight", H);
  a->tied = c.tie_word_embeddings;
  if (a->tied) {
    a->lm_head = Linear::separate({a->embed}, {{m + "embed_tokens", 0, V}});
    // Some tied checkpoints still ship lm_head.weight; HF ignores it, so do we.
    l.ignore("lm_head.weight");
  } else if (!bare || l.has("lm_head.weight")) {
    a->lm_head = Linear::separate({l.linear("lm_head", V, H, false)}, {{"lm_head", 0, V}});
  }  // else no head: the model embeds (engine/embedding.h) but gives no logits
  for (const std::string& prefix : parts.unloaded) l.ignore_prefix(prefix);
  l.check_all_claimed();
  a->storage = l.take_storage();
  return a;
}

}  // namespace metrale
