#pragma once
// The MTP layers a family ships beside its decoder stack, as a speculative drafter loads them
// (engine/mtp_proposer.h). A family with MTP layers registers a builder (registry.h); the
// recipe below is the DeepSeek-V3 / GLM-4.5 layout, which those families fill with their own
// mixer and FFN, as build_decoder_stack does for the stack.
#include <functional>
#include <memory>
#include <string>

#include "layers/mtp_layer.h"

namespace metrale {

// What the drafter loads: MTP layer 0. vLLM's drafter runs every draft through the first MTP
// layer (v1/spec_decode/eagle.py calls the model without spec_step_idx), so the layers after it
// are recognised and not loaded.
struct NextnMtpParts {
  // The blocks of the layer whose tensors start with `prefix` ("model.layers.<L>."); `index`
  // is its number in the checkpoint (L = num_hidden_layers), which decides dense vs MoE.
  std::function<std::unique_ptr<Mixer>(const std::string& prefix)> mixer;
  std::function<std::unique_ptr<Ffn>(int64_t index, const std::string& prefix)> ffn;
};

// model.layers.<L>.{enorm, hnorm, eh_proj, <decoder layer>, shared_head.norm,
// shared_head.head}: a shipped shared_head.head is loaded as the layer's own head unless its
// tensor equals the target's head (GLM-4.5 and DeepSeek-V3 ship copies), which is then shared;
// without one the target's lm_head serves. model.layers.<L>.embed_tokens is recognised and not
// loaded: vLLM embeds an MTP drafter's tokens with the target's embedding.
std::unique_ptr<MtpLayer> build_nextn_mtp(const ModelConfig& config, TensorLoader& loader,
                                          const NextnMtpParts& parts);

// Loads `config`'s MTP drafter layer through its family's builder: every tensor under the MTP
// layers' prefixes (MtpLayer::subtree) must be accounted for (others are the target's and left
// alone). Throws an Error naming the checkpoint when the family has no drafter or the config
// declares no MTP layers, and the tensor when one is missing, misshapen or unexpected.
std::unique_ptr<MtpLayer> load_mtp_layer(const ModelConfig& config, TensorLoader& loader);

}  // namespace metrale
