// Placeholder until the radix tree lands (same session): caches nothing.
#include "serve/prefix_cache.h"

namespace metrale {
namespace {
int64_t g_min_tokens = DEFAULT_MARCONI_MIN_TOKENS;
}
void set_marconi_min_tokens(int64_t tokens) { g_min_tokens = tokens; }
int64_t marconi_min_tokens() { return g_min_tokens; }
struct PrefixCache::Impl {
  Model* model;
  PrefixCacheStats stats;
};
PrefixCache::PrefixCache(Model& model, const PrefixCacheOptions&)
    : impl_(std::make_unique<Impl>(Impl{&model, {}})) {}
PrefixCache::~PrefixCache() = default;
bool PrefixCache::enabled() const { return false; }
int64_t PrefixCache::attach(Sequence&, std::span<const int32_t>) {
  ++impl_->stats.lookups;
  return 0;
}
void PrefixCache::insert(const Sequence&) {}
bool PrefixCache::wants_snapshot_at(int64_t) const { return false; }
int64_t PrefixCache::make_room(int64_t) { return impl_->model->kv_pool().free_pages(); }
int64_t PrefixCache::evictable_pages() const { return 0; }
void PrefixCache::clear() {}
PrefixCacheStats PrefixCache::stats() const { return impl_->stats; }
}  // namespace metrale
