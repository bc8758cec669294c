#pragma once
// The recipe every decoder-only family shares: embedding, n_layers x (input norm, mixer,
// post-attention norm, FFN), final norm, lm_head (tied or not). A family passes what differs
// per layer — its mixer and FFN — and reads like a table of its blocks.
#include <functional>
#include <memory>
#include <string>

#include "layers/architecture.h"

namespace metrale {

struct DecoderStackParts {
  // The blocks of layer `i`, whose tensors start with `prefix` ("model.layers.i.").
  std::function<std::unique_ptr<Mixer>(int64_t i, const std::string& prefix)> mixer;
  std::function<std::unique_ptr<Ffn>(int64_t i, const std::string& prefix)> ffn;
};

std::unique_ptr<Architecture> build_decoder_stack(const ModelConfig& config, TensorLoader& loader,
                                                  const DecoderStackParts& parts);

}  // namespace metrale
