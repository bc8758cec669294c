#pragma once
// Architecture: what a model family builds from a checkpoint — the embedding, the layer
// stack (each layer a composition of blocks), the final norm and the head. The engine holds
// an Architecture and never names a family; a family is one file under src/models/ and one
// line in src/models/registry.cc, which maps config.json's model_type to its builder.
//
// record() writes one pass of the model as a Graph (graph/graph.h): the prologue (embedding,
// LoRA token overlays), every layer, and the epilogues: the pooled rows (final norm, their
// sums per embedding input) and the head (the wanted rows, final norm, lm_head, logit
// overlays). The engine records it once at load and runs it for every step.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "graph/graph.h"
#include "layers/decoder_layer.h"
#include "layers/linear.h"

namespace metrale {

// The external buffers of a recorded model pass, which the engine binds per step
// (Executor::bind): the residual stream and the output logits.
struct ModelIo {
  BufferId h = -1;         // [rows, hidden]
  BufferId delta = -1;     // [rows, hidden] the last sub-block's output, not yet added to h
  BufferId logits = -1;    // [wanted, vocab] contiguous
  BufferId injected = -1;  // [injected, injected_cols()] the caller's input embeddings
  BufferId pooled = -1;    // [pools, hidden] contiguous: the pooled sums (embeddings)
};

class Architecture {
 public:
  virtual ~Architecture() = default;

  WeightTensor embed;  // [V, H] model.embed_tokens.weight
  std::vector<DecoderLayer> layers;
  Norm final_norm;  // [H] model.norm.weight
  Linear lm_head;   // [V, H] lm_head.weight, or embed's data when tied; empty: none
  bool tied = false;
  // Qwen3-VL's deepstack: the injected rows carry this many more hidden-wide features after the
  // input embedding ([embedding | deepstack 0 | ...], ModelIo::injected), and feature i is added
  // to the residual stream at those rows after layer i (transformers' _deepstack_process): a
  // per-layer hook of record(), InjectRows(add) nodes that run only in passes that inject.
  int64_t deepstack = 0;
  // The injected rows' width: hidden * (1 + deepstack).
  int64_t injected_cols() const { return embed.n_in * (1 + deepstack); }
  // Whether there is a head: a base model saved without one (an embedding model) has none,
  // and its passes give no logits.
  bool has_head() const { return lm_head.n_out() > 0; }
  // LoRA token overlays per slot (lora/lora_pool.h attaches them; empty: none).
  std::span<const LoraSlotOverlay> lora_overlays;
  // Owns the memory the tensors above point into when they were copied out of the mmap.
  std::vector<std::shared_ptr<const Buffer>> storage;

  // Records one pass into `g` (empty) and returns its external buffers.
  virtual ModelIo record(Graph& g, const RecordOptions& options) const;
  // Weight bytes one decoded token reads: every layer's active bytes plus the lm_head.
  uint64_t active_bytes_per_token() const;
  // What LoRA may adapt: every layer's sites, then the lm_head.
  LoraSites lora_sites();
};

}  // namespace metrale
