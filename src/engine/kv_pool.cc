#include "engine/kv_pool.h"

#include "core/error.h"

namespace metrale {

KvPool::KvPool(Backend& backend, int64_t n_layers, KvLayout layout) : layout_(layout) {
  METRALE_CHECK(layout.n_pages > 0 && layout.page_size > 0 && layout.row_elems() > 0,
                "kv cache: bad layout (", layout.n_pages, " pages of ", layout.page_size,
                " tokens)");
  METRALE_CHECK(layout.n_pages <= INT32_MAX, "kv cache: too many pages: ", layout.n_pages);
  const size_t bytes = static_cast<size_t>(layout.layer_elems()) * sizeof(float);
  buffers_.reserve(static_cast<size_t>(n_layers));
  for (int64_t i = 0; i < n_layers; ++i) {
    buffers_.push_back(backend.allocate(2 * bytes));
    float* base = buffers_.back().as<float>();
    layers_.push_back({.k = base, .v = base + layout.layer_elems(), .layout = layout});
  }
  free_.reserve(static_cast<size_t>(layout.n_pages));
  for (int64_t p = layout.n_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
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
