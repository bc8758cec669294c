#pragma once
// The recipe every decoder-only family shares: embedding, n_layers x (input norm, mixer,
// post-attention norm, FFN), final norm, lm_head (tied or not). A family passes what differs
// per layer — its mixer and FFN — and reads like a table of its blocks.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/architecture.h"

namespace metrale {

struct DecoderStackParts {
  // Where the language model's tensors start: "model." (a *ForCausalLM checkpoint), or
  // "model.language_model." (a vision-language checkpoint); lm_head.weight is top-level in both.
  // With "model.", a checkpoint of the bare base model (embed_tokens.weight at the top level,
  // as sentence-transformers saves embedding models) loads too, without a head when it has no
  // lm_head.weight and its embeddings are not tied.
  std::string prefix = "model.";
  // Checkpoint subtrees that are recognised and deliberately not loaded (a vision tower, MTP
  // layers), each a tensor-name prefix.
  std::vector<std::string> unloaded;
  // GLM-4: every layer also normalises its attention's and MLP's outputs before the residual
  // adds (post_self_attn_layernorm, post_mlp_layernorm).
  bool sandwich_norms = false;
  // The blocks of layer `i`, whose tensors start with `prefix` ("model.layers.i.").
  std::function<std::unique_ptr<Mixer>(int64_t i, const std::string& prefix)> mixer;
  std::function<std::unique_ptr<Ffn>(int64_t i, const std::string& prefix)> ffn;
};

std::unique_ptr<Architecture> build_decoder_stack(const ModelConfig& config, TensorLoader& loader,
                                                  const DecoderStackParts& parts);

}  // namespace metrale
