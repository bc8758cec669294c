#include "serve/prefix_cache.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace metrale {
namespace {

// Which adapter computed a tree's pages: the LoraRef's slot and generation ((-1, 0): the base
// model). A slot's generation changes whenever it is loaded or unloaded, so an adapter
// reloaded later (or another adapter in the same slot) never meets the old entries; those
// go stale and are evicted like any unused prefix.
using AdapterKey = std::pair<int32_t, uint32_t>;

AdapterKey adapter_key(const Sequence& seq) {
  return seq.lora.base() ? AdapterKey{-1, 0} : AdapterKey{seq.lora.slot, seq.lora.generation};
}

// The prefill FLOPs an approximate transformer spends on a prefix of d tokens: 2 per active
// parameter per token, plus causal attention's QK^T and AV, about 2 * n_heads * head_dim * d^2
// per attention layer. Parameters are active weight bytes / 2 (bf16, the usual serving
// dtype); only the ratio of the two terms matters, since Marconi's utility normalises.
struct FlopModel {
  double per_token = 0;   // 2 * active parameters
  double per_token2 = 0;  // 2 * n_heads * head_dim, summed over the attention layers
  double operator()(int64_t d) const {
    const auto x = static_cast<double>(d);
    return per_token * x + per_token2 * x * x;
  }
};

}  // namespace

// The tree. A node is an edge of whole pages (its tokens and the pages holding their K/V)
// below its parent; children are keyed by the tokens of their first page, so two children
// of one node differ within their first page. Every adapter has its own root (an empty
// edge). A hybrid model's snapshot sits at a node's end (the state after `depth` tokens).
struct PrefixCache::Impl {
  struct Node {
    Node* parent = nullptr;
    std::vector<int32_t> tokens;   // the edge: a whole number of pages
    std::vector<int32_t> pages;    // tokens.size() / page_size
    std::vector<uint64_t> hashes;  // with events: kv_block_hash of each page, else empty
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    int64_t depth = 0;      // tokens from the root to the end of this edge
    uint64_t last_use = 0;  // `clock` when an attach or insert last went through it
    int64_t snapshot = -1;  // StatePool snapshot block of the state after `depth` tokens
  };

  Model& model;
  KvPool& kv;
  PrefixCacheOptions options;
  int64_t page = 0;
  bool hybrid = false;
  int64_t snapshot_slots = 0;
  uint64_t snapshot_bytes = 0;
  FlopModel flops;
  std::map<AdapterKey, std::unique_ptr<Node>> roots;
  std::vector<int64_t> free_snapshots;  // a stack, lowest index on top
  uint64_t clock = 0;
  PrefixCacheStats stats;
  std::vector<KvCacheEvent> events;  // with options.events, until take_events()

  // The name of the adapter that computed a root's pages ("" for the base model).
  std::string adapter_name(const Sequence& seq) const {
    if (seq.lora.base()) return "";
    const LoraPool* pool = model.lora_pool();
    return pool != nullptr ? pool->slots()[static_cast<size_t>(seq.lora.slot)].name : "";
  }

  Impl(Model& m, const PrefixCacheOptions& o)
      : model(m), kv(m.kv_pool()), options(o), page(m.kv_pool().page_size()) {
    METRALE_CHECK(o.marconi_alpha >= 0, "prefix cache: marconi_alpha must be >= 0, found ",
                  o.marconi_alpha);
    if (const StatePool* state = m.state_pool(); state != nullptr) {
      hybrid = true;
      snapshot_slots = state->plan().snapshot_slots;
      snapshot_bytes = state->plan().block_bytes;
      for (int64_t i = snapshot_slots - 1; i >= 0; --i) free_snapshots.push_back(i);
    }
    const ModelConfig& c = m.config();
    flops.per_token = static_cast<double>(m.active_weight_bytes());  // 2 * bytes / 2
    for (int64_t i = 0; i < c.n_layers; ++i) {
      if (c.layer_kind(i) != LayerKind::kLinearAttention)
        flops.per_token2 += 2.0 * static_cast<double>(c.n_heads * c.head_dim);
    }
  }

  ~Impl() {
    for (auto& [key, root] : roots) {
      for_each(root.get(), [&](Node* x) { kv.drop(x->pages); });
    }
  }

  template <typename Fn>
  static void for_each(Node* x, const Fn& fn) {
    fn(x);
    for (auto& [key, child] : x->children) for_each(child.get(), fn);
  }

  // The page of `tokens` starting at page index `i`.
  std::vector<int32_t> page_tokens(std::span<const int32_t> tokens, int64_t i) const {
    const auto from = tokens.begin() + i * page;
    return {from, from + page};
  }
  // Whether page `k` of x's edge holds the tokens of page `i` of `tokens`.
  bool page_matches(const Node& x, int64_t k, std::span<const int32_t> tokens, int64_t i) const {
    return std::equal(x.tokens.begin() + k * page, x.tokens.begin() + (k + 1) * page,
                      tokens.begin() + i * page);
  }
  void touch(Node* x) { x->last_use = ++clock; }

  // Follows `tokens` down from `root` for at most `limit` whole pages. For each edge it
  // enters, calls visit(node, k, whole): k pages of the node's edge matched, whole when all
  // of them did (the walk then goes on below it). Returns the pages matched.
  template <class Visit>
  int64_t walk(Node* root, std::span<const int32_t> tokens, int64_t limit,
               const Visit& visit) const {
    Node* x = root;
    int64_t matched = 0;
    while (matched < limit) {
      const auto child = x->children.find(page_tokens(tokens, matched));
      if (child == x->children.end()) break;
      Node* c = child->second.get();
      const auto edge = static_cast<int64_t>(c->pages.size());
      int64_t k = 1;  // the first page matched by the key
      while (k < edge && matched + k < limit && page_matches(*c, k, tokens, matched + k)) ++k;
      matched += k;
      visit(c, k, k == edge);
      if (k < edge) break;
      x = c;
    }
    return matched;
  }

  // Splits x's edge after its first k pages (0 < k < its pages): a new node takes those and
  // becomes x's parent. Returns the new node. References and snapshot stay (x keeps its end).
  Node* split(Node* x, int64_t k) {
    Node* parent = x->parent;
    std::unique_ptr<Node>& slot = parent->children.at(page_tokens(x->tokens, 0));
    auto upper = std::make_unique<Node>();
    upper->parent = parent;
    upper->tokens.assign(x->tokens.begin(), x->tokens.begin() + k * page);
    upper->pages.assign(x->pages.begin(), x->pages.begin() + k);
    if (!x->hashes.empty()) {
      upper->hashes.assign(x->hashes.begin(), x->hashes.begin() + k);
      x->hashes.erase(x->hashes.begin(), x->hashes.begin() + k);
    }
    upper->depth = x->depth - static_cast<int64_t>(x->pages.size() - static_cast<size_t>(k)) * page;
    upper->last_use = x->last_use;
    x->tokens.erase(x->tokens.begin(), x->tokens.begin() + k * page);
    x->pages.erase(x->pages.begin(), x->pages.begin() + k);
    x->parent = upper.get();
    upper->children.emplace(page_tokens(x->tokens, 0), std::move(slot));
    slot = std::move(upper);
    return slot.get();
  }

  // Marconi's FLOP efficiency of a node's snapshot: the prefill FLOPs restoring it saves per
  // byte it keeps (the prefix's KV plus the snapshot). 0 without a snapshot: a hybrid model
  // cannot resume at a node without one, so it saves nothing on its own.
  double efficiency(const Node& x) const {
    if (x.snapshot < 0) return 0;
    const double bytes = static_cast<double>(x.depth) * static_cast<double>(kv.bytes_per_token()) +
                         static_cast<double>(snapshot_bytes);
    return flops(x.depth) / bytes;
  }

  // The candidate with the lowest Marconi utility: recency rank (0 oldest .. 1 newest) +
  // alpha * efficiency / the candidates' highest efficiency. Ties go to the older.
  Node* lowest_utility(std::vector<Node*> candidates) const {
    std::sort(candidates.begin(), candidates.end(),
              [](const Node* a, const Node* b) { return a->last_use < b->last_use; });
    double top = 0;
    for (const Node* x : candidates) top = std::max(top, efficiency(*x));
    const auto n = static_cast<double>(candidates.size());
    Node* best = nullptr;
    double best_utility = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const double recency = n > 1 ? static_cast<double>(i) / (n - 1) : 0;
      const double flop = top > 0 ? efficiency(*candidates[i]) / top : 0;
      const double utility = recency + options.marconi_alpha * flop;
      if (best == nullptr || utility < best_utility) {
        best = candidates[i];
        best_utility = utility;
      }
    }
    return best;
  }

  // How many of x's last pages only the tree holds (what evicting x could give back).
  int64_t unused_tail(const Node& x) const {
    int64_t t = 0;
    while (t < static_cast<int64_t>(x.pages.size()) &&
           kv.refs(x.pages[x.pages.size() - 1 - static_cast<size_t>(t)]) == 1)
      ++t;
    return t;
  }

  void drop_snapshot(Node* x) {
    if (x->snapshot < 0) return;
    free_snapshots.push_back(x->snapshot);
    x->snapshot = -1;
    --stats.snapshots_held;
    ++stats.evicted_snapshots;
  }

  // Leaves with pages only the tree holds at the end of their edge.
  std::vector<Node*> evictable_leaves() const {
    std::vector<Node*> out;
    for (const auto& entry : roots) {
      const Node* root = entry.second.get();
      for_each(entry.second.get(), [&](Node* x) {
        if (x != root && x->children.empty() && unused_tail(*x) > 0) out.push_back(x);
      });
    }
    return out;
  }

  // Gives back the pages at the end of leaf x that only the tree holds, and its snapshot (the
  // node no longer ends where it was taken). A leaf left with no pages goes (a root left
  // with no children goes in remove_empty_roots).
  void evict(Node* x) {
    const std::vector<int32_t> key = page_tokens(x->tokens, 0);
    const int64_t t = unused_tail(*x);
    const auto keep = x->pages.size() - static_cast<size_t>(t);
    kv.drop(std::span<const int32_t>(x->pages).subspan(keep));
    x->pages.resize(keep);
    if (options.events && t > 0) {
      // Built in place: g++ 12 misreads a moved variant temporary as uninitialised.
      auto& removed =
          std::get<KvBlockRemoved>(events.emplace_back(std::in_place_type<KvBlockRemoved>));
      removed.block_hashes.assign(x->hashes.begin() + static_cast<int64_t>(keep), x->hashes.end());
    }
    if (!x->hashes.empty()) x->hashes.resize(keep);
    x->tokens.resize(keep * static_cast<size_t>(page));
    x->depth -= t * page;
    stats.pages_held -= t;
    stats.evicted_pages += t;
    drop_snapshot(x);
    if (!x->pages.empty()) return;
    x->parent->children.erase(key);  // x is gone
  }

  void remove_empty_roots() {
    std::erase_if(roots, [](const auto& kv_pair) { return kv_pair.second->children.empty(); });
  }

  // A snapshot block for a new snapshot: a free one, else the one the node with the lowest
  // Marconi utility gives up. Needs snapshot_slots > 0 (every block is then free or held).
  int64_t take_snapshot_block() {
    if (free_snapshots.empty()) {
      std::vector<Node*> held;
      for (const auto& [key, root] : roots)
        for_each(root.get(), [&](Node* x) {
          if (x->snapshot >= 0) held.push_back(x);
        });
      METRALE_CHECK(!held.empty(), "prefix cache: no snapshot block is free or held (",
                    snapshot_slots, " blocks)");
      drop_snapshot(lowest_utility(std::move(held)));
    }
    const int64_t b = free_snapshots.back();
    free_snapshots.pop_back();
    return b;
  }

  // {pages of x's subtree that evicting could give back, whether all of them}.
  std::pair<int64_t, bool> evictable(const Node& x) const {
    int64_t total = 0;
    bool all = true;
    for (const auto& [key, child] : x.children) {
      const auto [pages, whole] = evictable(*child);
      total += pages;
      all = all && whole;
    }
    if (!all) return {total, false};  // x's pages wait for its children
    const int64_t t = unused_tail(x);
    return {total + t, t == static_cast<int64_t>(x.pages.size())};
  }
};

PrefixCache::PrefixCache(Model& model, const PrefixCacheOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {
  pin_marconi_min_tokens("a prefix cache");
}

PrefixCache::~PrefixCache() = default;

bool PrefixCache::enabled() const { return impl_->options.enabled; }

int64_t PrefixCache::attach(Sequence& seq, std::span<const int32_t> prompt,
                            std::span<const int32_t> key) {
  Impl& m = *impl_;
  ++m.stats.lookups;
  if (!m.options.enabled) return 0;
  METRALE_CHECK(seq.tokens.empty() && seq.block_table.empty(),
                "prefix cache: attach to a sequence that already holds ", seq.tokens.size(),
                " tokens");
  METRALE_CHECK(!prompt.empty(), "prefix cache: attach of an empty prompt");
  METRALE_CHECK(key.empty() || key.size() == prompt.size(), "prefix cache: a key of ", key.size(),
                " entries for a prompt of ", prompt.size());
  if (key.empty()) key = prompt;
  const auto found = m.roots.find(adapter_key(seq));
  if (found == m.roots.end()) return 0;
  // At least one prompt token is left to compute: its logits are the first sample.
  const int64_t limit = (static_cast<int64_t>(prompt.size()) - 1) / m.page;
  const int64_t min_depth = marconi_min_tokens();
  std::vector<int32_t> pages;
  std::vector<Impl::Node*> path;
  int64_t restore = 0;  // hybrid: pages down to the deepest usable snapshot
  int64_t snapshot = -1;
  const int64_t matched =
      m.walk(found->second.get(), key, limit, [&](Impl::Node* c, int64_t k, bool whole) {
        pages.insert(pages.end(), c->pages.begin(), c->pages.begin() + k);
        path.push_back(c);
        if (whole && m.hybrid && c->snapshot >= 0 && c->depth >= min_depth) {
          restore = c->depth / m.page;
          snapshot = c->snapshot;
        }
      });
  const int64_t adopt = m.hybrid ? restore : matched;
  if (adopt == 0) return 0;
  const int64_t n = adopt * m.page;
  m.model.adopt_prefix(seq, prompt.first(static_cast<size_t>(n)),
                       std::span<const int32_t>(pages).first(static_cast<size_t>(adopt)), snapshot);
  for (Impl::Node* used : path) {
    if (used->depth - static_cast<int64_t>(used->tokens.size()) < n) m.touch(used);
  }
  ++m.stats.hits;
  m.stats.tokens_saved += n;
  return n;
}

void PrefixCache::insert(const Sequence& seq, std::span<const int32_t> key) {
  Impl& m = *impl_;
  if (!m.options.enabled) return;
  const auto n_tokens = static_cast<int64_t>(seq.tokens.size());
  METRALE_CHECK(static_cast<int64_t>(seq.block_table.size()) * m.page >= n_tokens,
                "prefix cache: insert of a sequence of ", n_tokens, " tokens with only ",
                seq.block_table.size(), " pages");
  const int64_t n_pages = n_tokens / m.page;
  // A hybrid model resumes only where a snapshot is: its pages are recorded together with
  // the snapshot at their end (pages past the deepest snapshot could never be adopted).
  const bool snap = m.hybrid && n_tokens % m.page == 0 && wants_snapshot_at(n_tokens);
  if (n_pages == 0 || (m.hybrid && !snap)) return;
  std::unique_ptr<Impl::Node>& root = m.roots[adapter_key(seq)];
  if (root == nullptr) root = std::make_unique<Impl::Node>();
  Impl::Node* x = root.get();
  METRALE_CHECK(key.empty() || key.size() >= seq.tokens.size(), "prefix cache: a key of ",
                key.size(), " entries for a sequence of ", seq.tokens.size());
  const std::span<const int32_t> tokens =
      key.empty() ? std::span<const int32_t>(seq.tokens) : key.first(seq.tokens.size());
  int64_t at = 0;  // pages
  while (at < n_pages) {
    const auto child = x->children.find(m.page_tokens(tokens, at));
    if (child == x->children.end()) {
      // The rest of the sequence's whole pages become a new leaf sharing its page ids.
      auto leaf = std::make_unique<Impl::Node>();
      leaf->parent = x;
      leaf->tokens.assign(tokens.begin() + at * m.page, tokens.begin() + n_pages * m.page);
      leaf->pages.assign(seq.block_table.begin() + at, seq.block_table.begin() + n_pages);
      leaf->depth = n_pages * m.page;
      m.kv.retain(leaf->pages);  // throws for pages the sequence does not hold
      m.stats.pages_held += n_pages - at;
      if (m.options.events) {
        // The pages' chained hashes: each covers the prefix up to its end (x's last page is
        // the parent; a root has none).
        auto& stored =
            std::get<KvBlockStored>(m.events.emplace_back(std::in_place_type<KvBlockStored>));
        stored.parent_block_hash =
            x->hashes.empty() ? std::nullopt : std::optional<uint64_t>(x->hashes.back());
        stored.token_ids = leaf->tokens;
        stored.block_size = m.page;
        stored.lora_name = m.adapter_name(seq);
        if (!seq.lora.base()) stored.lora_id = seq.lora.slot + 1;
        std::optional<uint64_t> prev = stored.parent_block_hash;
        for (int64_t i = 0; i < n_pages - at; ++i) {
          prev = kv_block_hash(prev, std::span(leaf->tokens).subspan(i * m.page, m.page),
                               stored.lora_name);
          stored.block_hashes.push_back(*prev);
        }
        leaf->hashes = stored.block_hashes;
      }
      Impl::Node* added = leaf.get();
      x->children.emplace(m.page_tokens(tokens, at), std::move(leaf));
      x = added;
      m.touch(x);
      break;
    }
    // Pages the tree has for the same tokens stay (with their ids); the sequence keeps its own.
    Impl::Node* c = child->second.get();
    const auto edge = static_cast<int64_t>(c->pages.size());
    int64_t k = 1;
    while (k < edge && at + k < n_pages && m.page_matches(*c, k, tokens, at + k)) ++k;
    // Split where the sequence diverges inside c's edge, or where it ends inside it when a
    // snapshot is due there (a snapshot sits at a node's end); a sequence that just ends
    // inside c's edge leaves it whole.
    if (k < edge && (at + k < n_pages || snap)) c = m.split(c, k);
    m.touch(c);
    x = c;
    at += k;
  }
  if (snap && x->depth == n_tokens && x->snapshot < 0) {
    const int64_t b = m.take_snapshot_block();
    try {
      m.model.save_state(seq, b);
    } catch (...) {
      m.free_snapshots.push_back(b);
      throw;
    }
    x->snapshot = b;
    ++m.stats.snapshots_held;
  }
}

std::vector<int64_t> PrefixCache::snapshot_points(const Sequence& seq,
                                                  std::span<const int32_t> prompt) const {
  const Impl& m = *impl_;
  std::vector<int64_t> points;
  if (prompt.empty()) return points;
  const int64_t limit = (static_cast<int64_t>(prompt.size()) - 1) / m.page;  // pages
  // Where the prompt leaves the tree: whole pages matched along any path, mid-edge included.
  int64_t matched = 0;
  if (const auto found = m.roots.find(adapter_key(seq)); found != m.roots.end()) {
    matched = m.walk(found->second.get(), prompt, limit, [](Impl::Node*, int64_t, bool) {});
  }
  for (const int64_t pages : {matched, limit}) {
    const int64_t n = pages * m.page;
    if (n > static_cast<int64_t>(seq.tokens.size()) && wants_snapshot_at(n) &&
        (points.empty() || points.back() != n))
      points.push_back(n);
  }
  return points;
}

bool PrefixCache::wants_snapshot_at(int64_t n_tokens) const {
  const Impl& m = *impl_;
  return m.options.enabled && m.hybrid && m.snapshot_slots > 0 && n_tokens > 0 &&
         n_tokens % m.page == 0 && n_tokens >= marconi_min_tokens();
}

int64_t PrefixCache::make_room(int64_t pages) {
  Impl& m = *impl_;
  while (m.kv.free_pages() < pages) {
    std::vector<Impl::Node*> leaves = m.evictable_leaves();
    if (leaves.empty()) break;
    // Dense models: least recently used first. Hybrid models: Marconi's utility.
    Impl::Node* victim = m.hybrid ? m.lowest_utility(std::move(leaves))
                                  : *std::min_element(leaves.begin(), leaves.end(),
                                                      [](const Impl::Node* a, const Impl::Node* b) {
                                                        return a->last_use < b->last_use;
                                                      });
    m.evict(victim);
  }
  m.remove_empty_roots();
  return m.kv.free_pages();
}

int64_t PrefixCache::evictable_pages() const {
  int64_t total = 0;
  for (const auto& [key, root] : impl_->roots) total += impl_->evictable(*root).first;
  return total;
}

void PrefixCache::clear() {
  Impl& m = *impl_;
  for (std::vector<Impl::Node*> leaves = m.evictable_leaves(); !leaves.empty();
       leaves = m.evictable_leaves()) {
    for (Impl::Node* x : leaves) m.evict(x);
  }
  m.remove_empty_roots();
  if (m.options.events && m.roots.empty()) {
    m.events.emplace_back(std::in_place_type<KvAllBlocksCleared>);
  }
}

std::vector<KvCacheEvent> PrefixCache::take_events() {
  std::vector<KvCacheEvent> out;
  out.swap(impl_->events);
  return out;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = impl_->stats;
  s.bytes_held =
      static_cast<uint64_t>(s.pages_held) * static_cast<uint64_t>(impl_->kv.bytes_per_page()) +
      static_cast<uint64_t>(s.snapshots_held) * impl_->snapshot_bytes;
  return s;
}

}  // namespace metrale
