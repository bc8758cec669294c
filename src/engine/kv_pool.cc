#include "engine/kv_pool.h"

#include "core/error.h"

namespace metrale {

std::vector<KvShape> kv_shapes(const ModelConfig& c) {
  std::vector<KvShape> out;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    if (c.layer_kind(i) == LayerKind::kLinearAttention) {
      out.emplace_back();
    } else if (c.is_mla()) {
      out.push_back({1, c.mla.kv_lora_rank + c.mla.qk_rope_head_dim, true});
    } else {
      out.push_back({c.n_kv_heads, c.head_dim, false});
    }
  }
  return out;
}

std::vector<KvShape> uncompressed_kv_shapes(const ModelConfig& c) {
  std::vector<KvShape> out = kv_shapes(c);
  if (!c.is_mla()) return out;
  const MlaConfig& m = c.mla;
  for (KvShape& s : out) {
    s = {c.n_heads, m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim, true};
  }
  return out;
}

KvPool::KvPool(Backend& backend, int64_t n_pages, int64_t page_size,
               std::span<const KvShape> layers)
    : layout_{.n_pages = n_pages, .page_size = page_size} {
  METRALE_CHECK(n_pages > 0 && page_size > 0, "kv cache: bad layout (", n_pages, " pages of ",
                page_size, " tokens)");
  METRALE_CHECK(n_pages <= INT32_MAX, "kv cache: too many pages: ", n_pages);
  buffers_.reserve(layers.size());
  for (const KvShape& shape : layers) {
    KvLayout layout = layout_;
    layout.n_kv_heads = shape.n_kv_heads;
    layout.head_dim = shape.head_dim;
    layout.keys_only = shape.keys_only;
    if (shape.empty()) {
      layers_.push_back({.layout = layout});
      continue;
    }
    METRALE_CHECK(layout.row_elems() > 0, "kv cache: bad layer shape ", shape.n_kv_heads, " x ",
                  shape.head_dim);
    bytes_per_token_ += shape.bytes_per_token();
    const size_t bytes = static_cast<size_t>(layout.layer_elems()) * sizeof(float);
    buffers_.push_back(backend.allocate(shape.keys_only ? bytes : 2 * bytes));
    float* base = buffers_.back().as<float>();
    layers_.push_back({.k = base,
                       .v = shape.keys_only ? nullptr : base + layout.layer_elems(),
                       .layout = layout});
  }
  free_.reserve(static_cast<size_t>(n_pages));
  for (int64_t p = n_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

void KvPool::reserve(std::vector<int32_t>& block_table, int64_t n_tokens) {
  const int64_t need = (n_tokens + layout_.page_size - 1) / layout_.page_size;
  const int64_t more = need - static_cast<int64_t>(block_table.size());
  if (more <= 0) return;
  METRALE_CHECK(more <= free_pages(), "kv cache full: a sequence of ", n_tokens, " tokens needs ",
                more, " more page(s) of ", layout_.page_size, " tokens, ", free_pages(),
                " free of ", layout_.n_pages, " (raise --kv-tokens / LoadOptions::kv_tokens)");
  for (int64_t i = 0; i < more; ++i) {
    block_table.push_back(free_.back());
    free_.pop_back();
  }
}

void KvPool::truncate(std::vector<int32_t>& block_table, int64_t n_tokens) {
  METRALE_CHECK(n_tokens >= 0, "kv cache: truncate to ", n_tokens, " tokens");
  const auto keep = static_cast<size_t>((n_tokens + layout_.page_size - 1) / layout_.page_size);
  while (block_table.size() > keep) {
    free_.push_back(block_table.back());
    block_table.pop_back();
  }
}

void KvPool::release(std::vector<int32_t>& block_table) {
  for (auto it = block_table.rbegin(); it != block_table.rend(); ++it) free_.push_back(*it);
  block_table.clear();
}

}  // namespace metrale
