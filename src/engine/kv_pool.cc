#include "engine/kv_pool.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace metrale {
namespace {

// "3, 17 and 40" for an error message: at most 8 ids, then how many more.
std::string page_list(const std::vector<int32_t>& pages) {
  std::ostringstream os;
  const size_t shown = std::min<size_t>(pages.size(), 8);
  for (size_t i = 0; i < shown; ++i) os << (i == 0 ? "" : ", ") << pages[i];
  if (pages.size() > shown) os << " and " << pages.size() - shown << " more";
  return os.str();
}

}  // namespace

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
               std::span<const KvShape> layers, DType dtype)
    : backend_(&backend), layout_{.n_pages = n_pages, .page_size = page_size, .dtype = dtype} {
  METRALE_CHECK(kv_dtype_supported(dtype), "kv cache: element type ", dtype_name(dtype),
                " is not one of f32, f16, bf16");
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
    bytes_per_token_ += shape.bytes_per_token(dtype);
    const size_t bytes = static_cast<size_t>(layout.layer_elems() * layout.elem_bytes());
    buffers_.push_back(backend.allocate(shape.keys_only ? bytes : 2 * bytes));
    auto* base = buffers_.back().as<std::byte>();
    layers_.push_back({.k = base, .v = shape.keys_only ? nullptr : base + bytes, .layout = layout});
  }
  free_.reserve(static_cast<size_t>(n_pages));
  for (int64_t p = n_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
  refs_.assign(static_cast<size_t>(n_pages), 0);
}

int32_t KvPool::refs(int32_t page) const {
  METRALE_CHECK(page >= 0 && page < layout_.n_pages, "kv cache: page ", page,
                " is outside the pool [0, ", layout_.n_pages, ")");
  return refs_[static_cast<size_t>(page)];
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
    refs_[static_cast<size_t>(free_.back())] = 1;
    free_.pop_back();
  }
}

void KvPool::retain(std::span<const int32_t> pages) {
  std::vector<int32_t> outside, free;
  for (int32_t p : pages) {
    if (p < 0 || p >= layout_.n_pages)
      outside.push_back(p);
    else if (refs_[static_cast<size_t>(p)] == 0)
      free.push_back(p);
  }
  METRALE_CHECK(outside.empty(), "kv cache: retain of page(s) ", page_list(outside),
                " outside the pool [0, ", layout_.n_pages, ")");
  METRALE_CHECK(free.empty(), "kv cache: retain of free page(s) ", page_list(free),
                " (only pages some table holds can be shared)");
  for (int32_t p : pages) {
    METRALE_CHECK(refs_[static_cast<size_t>(p)] < INT32_MAX, "kv cache: page ", p,
                  " has too many references");
    ++refs_[static_cast<size_t>(p)];
  }
}

void KvPool::drop(std::span<const int32_t> pages) {
  // A page may be listed more than once: compare the count dropped with the count held.
  std::vector<int32_t> sorted(pages.begin(), pages.end()), outside, over;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    const int32_t p = sorted[i];
    if (p < 0 || p >= layout_.n_pages)
      outside.push_back(p);
    else if (static_cast<size_t>(refs_[static_cast<size_t>(p)]) < j - i)
      over.push_back(p);
    i = j;
  }
  METRALE_CHECK(outside.empty(), "kv cache: release of page(s) ", page_list(outside),
                " outside the pool [0, ", layout_.n_pages, ")");
  METRALE_CHECK(over.empty(), "kv cache: release of page(s) ", page_list(over),
                " that are free or hold fewer references than are dropped (released twice?)");
  // Last to first, so the free stack hands a table's pages out again in their old order.
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    if (--refs_[static_cast<size_t>(*it)] == 0) free_.push_back(*it);
  }
}

void KvPool::truncate(std::vector<int32_t>& block_table, int64_t n_tokens) {
  METRALE_CHECK(n_tokens >= 0, "kv cache: truncate to ", n_tokens, " tokens");
  const auto keep = static_cast<size_t>((n_tokens + layout_.page_size - 1) / layout_.page_size);
  if (block_table.size() <= keep) return;
  drop(std::span<const int32_t>(block_table).subspan(keep));
  block_table.resize(keep);
}

void KvPool::release(std::vector<int32_t>& block_table) {
  drop(block_table);
  block_table.clear();
}

void KvPool::unshare(std::vector<int32_t>& block_table, int64_t index) {
  METRALE_CHECK(index >= 0 && index < static_cast<int64_t>(block_table.size()),
                "kv cache: unshare of entry ", index, " of a table of ", block_table.size(),
                " pages");
  const int32_t from = block_table[static_cast<size_t>(index)];
  if (refs(from) <= 1) return;
  METRALE_CHECK(!free_.empty(), "kv cache full: copying shared page ", from,
                " before writing into it needs a free page, 0 free of ", layout_.n_pages,
                " (raise --kv-tokens / LoadOptions::kv_tokens)");
  const int32_t to = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(to)] = 1;
  --refs_[static_cast<size_t>(from)];
  for (const KvLayerView& l : layers_) {
    if (l.k == nullptr) continue;  // a layer that keeps nothing
    const int64_t bytes = l.layout.page_elems() * l.layout.elem_bytes();
    const auto page = [&](void* base, int32_t p) {
      return static_cast<std::byte*>(base) + p * bytes;
    };
    backend_->copy(page(l.k, to), page(l.k, from), static_cast<size_t>(bytes));
    if (l.v != nullptr) backend_->copy(page(l.v, to), page(l.v, from), static_cast<size_t>(bytes));
  }
  block_table[static_cast<size_t>(index)] = to;
}

}  // namespace metrale
