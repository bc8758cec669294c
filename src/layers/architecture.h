#pragma once
// Architecture: what a model family builds from a checkpoint — the embedding, the layer
// stack (each layer a composition of blocks), the final norm and the head. The engine holds
// an Architecture and never names a family; a family is one file under src/models/ and one
// line in src/models/registry.cc, which maps config.json's model_type to its builder.
#include <cstdint>
#include <memory>
#include <vector>

#include "layers/decoder_layer.h"
#include "layers/linear.h"

namespace metrale {

class Architecture {
 public:
  virtual ~Architecture() = default;

  WeightTensor embed;  // [V, H] model.embed_tokens.weight
  std::vector<DecoderLayer> layers;
  Norm final_norm;  // [H] model.norm.weight
  Linear lm_head;   // [V, H] lm_head.weight, or embed's data when tied
  bool tied = false;
  // Owns the memory the tensors above point into when they were copied out of the mmap.
  std::vector<std::shared_ptr<const Buffer>> storage;

  // The most workspace one layer takes for a pass of max_rows rows.
  size_t workspace_floats(int64_t max_rows) const;
  // Weight bytes one decoded token reads: every layer's active bytes plus the lm_head.
  uint64_t active_bytes_per_token() const;
  // What LoRA may adapt: every layer's sites, then the lm_head.
  LoraSites lora_sites();
};

}  // namespace metrale
