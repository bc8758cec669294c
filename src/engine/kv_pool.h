#pragma once
// The paged KV cache of a model: one pool of fixed-size pages shared by every sequence, the
// same page index used in every layer. A sequence owns a block table (its pages in token
// order); pages return to the free list when the sequence is released.
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace metrale {

class KvPool {
 public:
  KvPool(Backend& backend, int64_t n_layers, KvLayout layout);

  const KvLayout& layout() const { return layout_; }
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
  std::vector<Buffer> buffers_;  // per layer: K pages then V pages
  std::vector<KvLayerView> layers_;
  std::vector<int32_t> free_;  // a stack: most recently freed pages reused first
};

}  // namespace metrale
