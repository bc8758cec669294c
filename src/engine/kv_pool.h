#pragma once
// The paged KV cache of a model: one pool of fixed-size pages shared by every sequence, the
// same page index used in every layer. A sequence owns a block table (its pages in token
// order); pages return to the free list when the sequence is released.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "io/config/model_config.h"

namespace metrale {

// What each layer keeps per token in the KV cache, from the config alone (`metrale inspect`
// reports it; Model::load checks the built layers agree): K and V of n_kv_heads x head_dim for
// softmax attention, the latent plus the rope key (keys only) for MLA, nothing for a linear-
// attention layer.
std::vector<KvShape> kv_shapes(const ModelConfig& config);
// The same for the uncompressed layout: an MLA layer's expanded per-head keys [k_nope | k_rope]
// and values, what a plain multi-head cache of them would hold (transformers 5 itself caches
// the latents and re-expands them on every call); other layers as kv_shapes says.
std::vector<KvShape> uncompressed_kv_shapes(const ModelConfig& config);

class KvPool {
 public:
  // n_pages pages of page_size tokens; layer i keeps layers[i] per token (nothing when empty).
  KvPool(Backend& backend, int64_t n_pages, int64_t page_size, std::span<const KvShape> layers);

  // The pages (n_pages, page_size); each layer's heads are in layer(i).layout.
  const KvLayout& layout() const { return layout_; }
  // Bytes one token takes over all layers.
  int64_t bytes_per_token() const { return bytes_per_token_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  KvLayerView layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }

  // Grows `block_table` so it covers `n_tokens` tokens. Throws an Error when the pool is
  // out of pages (naming how many were needed and are free), leaving the table unchanged.
  void reserve(std::vector<int32_t>& block_table, int64_t n_tokens);
  // Shrinks the table to the pages `n_tokens` tokens need, returning the rest to the pool
  // (rollback of rejected draft tokens). K/V past n_tokens in the last kept page is simply
  // overwritten by the next tokens stored there.
  void truncate(std::vector<int32_t>& block_table, int64_t n_tokens);
  // Returns every page of the table to the pool and clears it.
  void release(std::vector<int32_t>& block_table);

 private:
  KvLayout layout_;
  int64_t bytes_per_token_ = 0;
  std::vector<Buffer> buffers_;  // per layer: K pages then V pages (none for an empty shape)
  std::vector<KvLayerView> layers_;
  std::vector<int32_t> free_;  // a stack: most recently freed pages reused first
};

}  // namespace metrale
