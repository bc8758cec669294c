// load_dense_weights: the HF names of llama / mistral / qwen2 / qwen3 checkpoints -> typed
// structs. Every tensor is checked against the shape the config implies before any byte is
// copied, and every checkpoint tensor must be claimed by some field (an unexpected tensor
// usually means the config and the weights disagree, e.g. a qwen3 checkpoint labelled qwen2).
#include "weights/dense_weights.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <set>

#include "core/error.h"
#include "weights/tensor_loader.h"

namespace metrale {

bool is_dense_model_type(std::string_view model_type) {
  static constexpr std::array<std::string_view, 4> kTypes = {"llama", "mistral", "qwen2", "qwen3"};
  return std::find(kTypes.begin(), kTypes.end(), model_type) != kTypes.end();
}

DenseModelWeights load_dense_weights(const ModelConfig& c, const Checkpoint& checkpoint,
                                     Backend& backend, WeightPlacement placement,
                                     void (*progress)(uint64_t, uint64_t)) {
  METRALE_CHECK(is_dense_model_type(c.model_type), c.source, ": model_type '", c.model_type,
                "' is not a dense decoder this loader maps (llama, mistral, qwen2, qwen3)");
  METRALE_CHECK(c.layer_kinds.size() == static_cast<size_t>(c.n_layers), c.source,
                ": layer kinds do not cover every layer");
  TensorLoader loader(checkpoint, backend, placement, progress);
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t Q = c.n_heads * D, KV = c.n_kv_heads * D, V = c.vocab_size;

  DenseModelWeights w;
  w.embed = loader.matrix("model.embed_tokens.weight", V, H);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    DenseLayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.input_norm = loader.norm(p + "input_layernorm.weight", H);
    l.post_attn_norm = loader.norm(p + "post_attention_layernorm.weight", H);
    if (loader.can_fuse()) {
      l.qkv = loader.fused_linear({p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"},
                                  {Q, KV, KV}, H, c.attention_qkv_bias);
    } else {
      l.q = loader.linear(p + "self_attn.q_proj", Q, H, c.attention_qkv_bias);
      l.k = loader.linear(p + "self_attn.k_proj", KV, H, c.attention_qkv_bias);
      l.v = loader.linear(p + "self_attn.v_proj", KV, H, c.attention_qkv_bias);
    }
    l.o = loader.linear(p + "self_attn.o_proj", H, Q, c.attention_out_bias);
    if (c.qk_norm) {
      l.q_norm = loader.norm(p + "self_attn.q_norm.weight", D);
      l.k_norm = loader.norm(p + "self_attn.k_norm.weight", D);
    }
    if (loader.can_fuse()) {
      l.gate_up = loader.fused_linear({p + "mlp.gate_proj", p + "mlp.up_proj"}, {I, I}, H, c.mlp_bias);
    } else {
      l.gate = loader.linear(p + "mlp.gate_proj", I, H, c.mlp_bias);
      l.up = loader.linear(p + "mlp.up_proj", I, H, c.mlp_bias);
    }
    l.down = loader.linear(p + "mlp.down_proj", H, I, c.mlp_bias);
  }
  w.final_norm = loader.norm("model.norm.weight", H);
  w.tied = c.tie_word_embeddings;
  if (w.tied) {
    w.lm_head = w.embed;
    // Some tied checkpoints still ship lm_head.weight; HF ignores it, so do we.
    loader.ignore("lm_head.weight");
  } else {
    w.lm_head = loader.matrix("lm_head.weight", V, H);
  }
  // Buffers written by transformers < 4.31 for the rotary embedding; never weights.
  for (int64_t i = 0; i < c.n_layers; ++i) {
    loader.ignore("model.layers." + std::to_string(i) + ".self_attn.rotary_emb.inv_freq");
  }
  loader.check_all_claimed();
  w.storage = loader.take_storage();
  return w;
}

}  // namespace metrale
