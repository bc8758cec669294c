#pragma once
// Prefix caching for the server: a radix tree over whole KV pages, keyed by the tokens they
// hold (and by the LoRA adapter that computed them), so a request whose prompt starts with
// tokens already computed adopts their pages instead of prefilling them again.
//
// - Pages are shared, not copied: the tree holds one reference on each page it caches
//   (KvPool's page reference counts), a sequence that adopts a prefix holds another. Only
//   whole pages are cached and adopted, and at least one prompt token is always left to
//   compute (its logits are the first sample).
// - Eviction: when the scheduler needs pages, unreferenced leaves go first, least recently
//   used first (dense models), or by Marconi's utility (hybrid models, below).
// - Hybrid models (Gated DeltaNet layers): attention KV alone cannot resume a sequence; the
//   recurrent state at the same token count is needed too. The cache keeps state snapshots
//   (StatePool snapshot blocks) at page boundaries the scheduler stops prefill chunks at, and
//   a prefix is adopted only down to the deepest node holding a snapshot, and only when that
//   depth is at least marconi_min_tokens() (Marconi's admission rule: a short match saves
//   less compute than the snapshot costs to keep). When snapshot blocks run out, the node
//   with the lowest utility gives its snapshot up:
//     utility = recency (0 oldest .. 1 newest, by rank) + alpha * (prefill FLOPs the node's
//               depth saves per byte it holds, normalised to 0..1 over the candidates)
//   (Marconi, Pan et al. 2025, "Marconi: Prefix Caching for the Era of Hybrid LLMs").
//
// Not thread-safe: the scheduler's thread owns it, as it owns the Model.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model.h"
#include "serve/kv_events.h"
#include "speculative/marconi.h"  // the floor snapshot admission reads

namespace metrale {

struct PrefixCacheOptions {
  bool enabled = true;
  double marconi_alpha = 1.0;  // weight of FLOPs-per-byte against recency (hybrid eviction)
  // Record a KvCacheEvent for every page the tree takes or gives back (take_events()).
  bool events = false;
};

struct PrefixCacheStats {
  int64_t lookups = 0;       // attach() calls
  int64_t hits = 0;          // attach() calls that adopted at least one page
  int64_t tokens_saved = 0;  // prompt tokens adopted instead of prefilled, summed
  int64_t pages_held = 0;    // pages the tree holds a reference on
  int64_t snapshots_held = 0;
  uint64_t bytes_held = 0;  // pages_held * page bytes + snapshots_held * snapshot bytes
  int64_t evicted_pages = 0;
  int64_t evicted_snapshots = 0;
};

class PrefixCache {
 public:
  // `model` must outlive the cache. Hybrid models need LoadOptions::state_snapshots > 0 for
  // any hit (without snapshot blocks nothing can be restored; the cache then only counts).
  PrefixCache(Model& model, const PrefixCacheOptions& options = {});
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool enabled() const;
  // Before the first step of `seq` (empty; its adapter already set): adopts the longest
  // cached prefix of `prompt` this model can resume from, leaving at least one token of the
  // prompt to compute. Returns the number of tokens adopted (0: nothing; seq unchanged).
  // `key` (empty: the prompt itself) is what the tree matches, one entry per prompt token: the
  // server keys image rows by content hash (negative ids no token has).
  int64_t attach(Sequence& seq, std::span<const int32_t> prompt, std::span<const int32_t> key = {});
  // Records `seq`'s whole pages (all of its tokens up to the last page boundary) in the tree,
  // sharing them (where the tree already holds the same tokens, its pages stay). Hybrid
  // models: only when wants_snapshot_at(seq's token count) — the pages together with a
  // snapshot of the recurrent state there (unless that node has one already); at any other
  // count nothing is recorded, since a hybrid model cannot resume from pages alone. Call
  // after steps (a prefill chunk ending at a page boundary; a finished request before
  // release).
  // `key`: as attach's, covering at least seq.tokens (empty: the tokens).
  void insert(const Sequence& seq, std::span<const int32_t> key = {});
  // Whether insert() would take a snapshot for a sequence of `n_tokens` (hybrid models: a
  // page boundary at or past the Marconi floor). The scheduler ends prefill chunks there.
  bool wants_snapshot_at(int64_t n_tokens) const;
  // Hybrid models: the token counts past seq's own at which the scheduler should end prefill
  // chunks of `prompt` so insert() can snapshot there — Marconi's two checkpoints: the page
  // boundary where the prompt leaves the tree (a branch point: the prefix it shares with
  // earlier requests, such as a system prompt, will likely be shared again) and the prompt's
  // last resumable page boundary (the same prompt again, or the next turn of its
  // conversation). Only points wants_snapshot_at() accepts, ascending; none for dense models.
  std::vector<int64_t> snapshot_points(const Sequence& seq, std::span<const int32_t> prompt) const;
  // Drops unreferenced cached pages (and their snapshots) until the KV pool has `pages` free
  // pages or nothing more can go. Returns the pool's free pages afterwards. The unit is a
  // leaf's edge: the pages at its end that only the tree holds (a leaf that a running
  // sequence shares in part keeps the shared pages).
  int64_t make_room(int64_t pages);
  // Pages the tree could give back now (held by nothing but the tree).
  int64_t evictable_pages() const;
  // Drops everything the tree holds that no sequence uses.
  void clear();
  // With PrefixCacheOptions::events: the events since the last call, in order — a
  // KvBlockStored when insert() adds pages, a KvBlockRemoved when eviction or clear() gives
  // pages back, a KvAllBlocksCleared when clear() leaves the tree empty.
  std::vector<KvCacheEvent> take_events();
  PrefixCacheStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace metrale
