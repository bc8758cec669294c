#pragma once
// The paged KV cache of a model: one pool of fixed-size pages shared by every sequence, the
// same page index used in every layer. A sequence holds a block table (its pages in token
// order). Pages are reference counted: a page reserve() hands out has one reference, its
// table's; the prefix cache (serve/prefix_cache.h) and the sequences that adopt a cached
// prefix retain() more. truncate() and release() drop one reference per page they remove,
// and a page returns to the free list when its last reference goes.
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
  // n_pages pages of page_size tokens; layer i keeps layers[i] per token (nothing when empty),
  // stored as `dtype` (kF32, kF16 or kBF16; anything else throws).
  KvPool(Backend& backend, int64_t n_pages, int64_t page_size, std::span<const KvShape> layers,
         DType dtype = DType::kF32);

  // The pages (n_pages, page_size, dtype); each layer's heads are in layer(i).layout.
  const KvLayout& layout() const { return layout_; }
  // Bytes one token takes over all layers.
  int64_t bytes_per_token() const { return bytes_per_token_; }
  int64_t page_size() const { return layout_.page_size; }
  // Bytes one page takes over all layers (K and V).
  int64_t bytes_per_page() const { return bytes_per_token_ * layout_.page_size; }
  int64_t n_pages() const { return layout_.n_pages; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  // The references `page` has (0: free). Throws for a page outside the pool.
  int32_t refs(int32_t page) const;
  KvLayerView layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }

  // Grows `block_table` so it covers `n_tokens` tokens with free pages (one reference each).
  // Throws an Error when the pool is out of pages (naming how many were needed and are
  // free), leaving the table unchanged.
  void reserve(std::vector<int32_t>& block_table, int64_t n_tokens);
  // Adds one reference to each of `pages` (a page listed twice gets two). Throws an Error
  // naming the pages outside the pool or free (nothing to share), changing nothing.
  void retain(std::span<const int32_t> pages);
  // Drops one reference from each of `pages`; a page whose last reference goes is free.
  // Throws an Error naming the pages outside the pool or with fewer references than are
  // dropped, changing nothing.
  void drop(std::span<const int32_t> pages);
  // Shrinks the table to the pages `n_tokens` tokens need, dropping its reference on the
  // rest (rollback of rejected draft tokens). K/V past n_tokens in the last kept page is
  // simply overwritten by the next tokens stored there — unless that page is shared, which
  // the step first replaces by a private copy (unshare()).
  void truncate(std::vector<int32_t>& block_table, int64_t n_tokens);
  // Drops the table's reference on every page and clears it.
  void release(std::vector<int32_t>& block_table);
  // Copy-on-write: when page block_table[index] has other references, copies its K/V (every
  // layer, every slot) into a free page, which replaces it in the table (the table's
  // reference moves to the copy). Nothing when the table is the page's only holder. Throws
  // when the index is outside the table or no page is free, leaving the table unchanged.
  // The copies are backend ops (the pages are backend memory).
  void unshare(std::vector<int32_t>& block_table, int64_t index);

 private:
  Backend* backend_;
  KvLayout layout_;
  int64_t bytes_per_token_ = 0;
  std::vector<Buffer> buffers_;  // per layer: K pages then V pages (none for an empty shape)
  std::vector<KvLayerView> layers_;
  std::vector<int32_t> free_;  // a stack: most recently freed pages reused first
  std::vector<int32_t> refs_;  // [n_pages] references per page; 0 on the free list
};

}  // namespace metrale
