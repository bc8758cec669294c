#pragma once
// The paged KV cache layout shared by every backend. The cache of one layer is two arrays of
// one element type (KvLayout::dtype: f32, or f16 / bf16 to halve the bytes; attention reads
// them back as f32 and computes in f32): V is [n_pages, page_size, n_kv_heads, head_dim] and K is
// transposed within each page, [n_pages, n_kv_heads, head_dim, page_size], so that the keys of a
// page lie contiguous for each (head, dim) and attention scores can put keys on vector lanes. Token
// t of a sequence lives in page block_table[t / page_size] at offset t % page_size. A "slot" is
// page * page_size + offset: the flat token index that kv_store writes to.
#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace metrale {

// What one layer keeps per token: n_kv_heads x head_dim keys and as many values, or keys only
// (keys_only: multi-head latent attention, whose cached latent serves as key and value). No
// heads: the layer keeps nothing in the KV cache (a Gated DeltaNet layer).
struct KvShape {
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  bool keys_only = false;

  bool empty() const { return n_kv_heads == 0; }
  int64_t elems_per_token() const { return (keys_only ? 1 : 2) * n_kv_heads * head_dim; }
  int64_t bytes_per_token(DType dtype = DType::kF32) const {
    return elems_per_token() * static_cast<int64_t>(dtype_bits(dtype) / 8);
  }
};

struct KvLayout {
  int64_t n_pages = 0;
  int64_t page_size = 0;  // tokens per page
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  bool keys_only = false;     // KvShape::keys_only: no V pages
  DType dtype = DType::kF32;  // element type of K and V: kF32, kF16 or kBF16

  int64_t row_elems() const { return n_kv_heads * head_dim; }  // one token's K (or V)
  int64_t page_elems() const { return page_size * row_elems(); }
  int64_t layer_elems() const { return n_pages * page_elems(); }
  int64_t n_slots() const { return n_pages * page_size; }
  int64_t elem_bytes() const { return dtype_bits(dtype) / 8; }
};

// Whether `t` may be a KV cache element type.
constexpr bool kv_dtype_supported(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// One layer's K and V pages (memory owned by whoever allocated the cache). The accessors take
// the element type T the caller reads the pages as (float for kF32, uint16_t bit patterns or a
// kernel's own 16-bit float type for kF16 / kBF16); T's size must match layout.dtype.
struct KvLayerView {
  void* k = nullptr;  // [n_pages, n_kv_heads, head_dim, page_size]
  void* v = nullptr;  // [n_pages, page_size, n_kv_heads, head_dim]; null when keys_only
  KvLayout layout;

  // K of kv head `h` in `page`: element (dim d, offset o) at [d * page_size + o].
  template <typename T = float>
  T* k_page(int64_t page, int64_t h) const {
    return static_cast<T*>(k) + page * layout.page_elems() + h * layout.head_dim * layout.page_size;
  }
  template <typename T = float>
  T* v_row(int64_t slot) const {
    return static_cast<T*>(v) + slot * layout.row_elems();
  }
};

// The pages of one sequence: block_table[i] is the page holding tokens
// [i * page_size, (i + 1) * page_size). seq_len counts every token whose K/V is stored,
// including the ones being processed in this call.
struct KvPageTable {
  std::span<const int32_t> block_table;
  int64_t seq_len = 0;

  int64_t slot(int64_t pos, int64_t page_size) const {
    return static_cast<int64_t>(block_table[static_cast<size_t>(pos / page_size)]) * page_size +
           pos % page_size;
  }
};

}  // namespace metrale
