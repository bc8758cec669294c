// The prefix cache on a dense model (models/demo, a tiny qwen3; pages of 16 tokens): a hit
// gives the same logits and greedy tokens as no cache, bit for bit (the engine is chunk- and
// batch-invariant: tests/engine/batch_invariance_test.cc); pages are shared, not copied, and
// copied on write; eviction; adapters; stats. Hybrid models: hybrid/prefix_cache_hybrid_test.cc.
#include "serve/prefix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "prefix_test_util.h"
#include "support/test_support.h"

namespace metrale {
namespace {

using test::error_of;

constexpr int64_t kPage = 16;

std::unique_ptr<Model> load_demo(int64_t kv_tokens = 512) {
  LoadOptions o;
  o.n_threads = 1;
  o.kv_tokens = kv_tokens;
  return Model::load("models/demo", o);
}

// n token ids drawn from a seeded generator (the demo's vocabulary is 2048).
using serve_test::argmax;
using serve_test::concat;
using serve_test::Output;

std::vector<int32_t> random_ids(size_t n, uint32_t seed) {
  return serve_test::random_ids(n, seed, 2000);
}

// Prompt then `n_new` greedy tokens, through `cache` when given (attach before, insert
// after), in one sequence released at the end.
Output generate(Model& m, PrefixCache* cache, const std::vector<int32_t>& prompt, int n_new,
                const std::string& adapter = "") {
  return serve_test::generate(m, cache, prompt, n_new, {.adapter = adapter});
}

TEST(PrefixCache, HitsGiveTheLogitsOfNoCacheBitForBit) {
  auto m = load_demo();
  PrefixCache cache(*m);
  const std::vector<int32_t> shared = random_ids(100, 1);
  const std::vector<int32_t> a = concat(shared, random_ids(40, 2));
  // Diverges from a inside page 6 (token 100) and at a page boundary (token 80).
  const std::vector<int32_t> mid = concat(shared, random_ids(30, 3));
  const std::vector<int32_t> edge =
      concat(std::vector<int32_t>(shared.begin(), shared.begin() + 80), random_ids(37, 4));
  EXPECT_EQ(generate(*m, &cache, a, 8).cached, 0);  // cold
  struct Case {
    const char* what;
    const std::vector<int32_t>& prompt;
    int64_t cached;
  };
  // a again: 8 of its 9 cached pages (floor(139 / 16)); one token at least is computed.
  for (const Case& c :
       {Case{"a again", a, 128}, Case{"mid-page", mid, 96}, Case{"page boundary", edge, 80}}) {
    const Output want = generate(*m, nullptr, c.prompt, 8);
    const Output got = generate(*m, &cache, c.prompt, 8);
    EXPECT_EQ(got.cached, c.cached) << c.what;
    EXPECT_EQ(got.tokens, want.tokens) << c.what;
    EXPECT_EQ(got.logits, want.logits) << c.what;  // bitwise
  }
  // a's 9 whole pages (140 prompt + 8 generated tokens), then mid's (138 tokens: 8 pages, 6
  // shared) and edge's (125 tokens: 7 pages, 5 shared) own.
  EXPECT_EQ(cache.stats().pages_held, 9 + 2 + 2);
}

TEST(PrefixCache, AWholeCachedPromptLeavesOneTokenToCompute) {
  auto m = load_demo();
  PrefixCache cache(*m);
  const std::vector<int32_t> p = random_ids(3 * kPage, 5);
  generate(*m, &cache, p, 0);  // 3 whole pages cached
  EXPECT_EQ(cache.stats().pages_held, 3);
  const Output want = generate(*m, nullptr, p, 4);
  const Output got = generate(*m, &cache, p, 4);
  EXPECT_EQ(got.cached, 2 * kPage);  // the last page is recomputed for its last token
  EXPECT_EQ(got.logits, want.logits);
  const std::vector<int32_t> longer = concat(p, {7});
  EXPECT_EQ(generate(*m, &cache, longer, 1).cached, 3 * kPage);
  Sequence one;
  EXPECT_EQ(cache.attach(one, std::vector<int32_t>{p[0]}), 0);  // a single token: nothing
  EXPECT_TRUE(one.tokens.empty());
}

TEST(PrefixCache, LiveSequencesShareThePagesAndDecodeAsAlone) {
  auto m = load_demo();
  PrefixCache cache(*m);
  const auto V = static_cast<size_t>(m->vocab_size());
  const std::vector<int32_t> prefix = random_ids(64, 6);
  const std::vector<int32_t> pa = concat(prefix, random_ids(9, 7));
  const std::vector<int32_t> pb = concat(prefix, random_ids(20, 8));
  const Output want_a = generate(*m, nullptr, pa, 6), want_b = generate(*m, nullptr, pb, 6);

  Sequence a, b;
  std::vector<float> la(V), lb(V);
  m->prefill(a, pa, la);
  cache.insert(a);  // 4 whole pages, shared with a
  EXPECT_EQ(cache.attach(b, pb), 64);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(b.block_table[i], a.block_table[i]);
    EXPECT_EQ(m->kv_pool().refs(a.block_table[i]), 3);  // a, the tree, b
  }
  m->prefill(b, std::span(pb).subspan(64), lb);
  Output got_a, got_b;
  got_a.logits.assign(la.begin(), la.end());
  got_b.logits.assign(lb.begin(), lb.end());
  std::vector<float> both(2 * V);
  std::vector<int32_t> next = {argmax(la), argmax(lb)};
  const std::vector<Sequence*> seqs = {&a, &b};
  for (int i = 0; i < 6; ++i) {  // one decode step for both
    got_a.tokens.push_back(next[0]);
    got_b.tokens.push_back(next[1]);
    m->decode(seqs, next, both);
    const std::span<const float> row_a = std::span(both).first(V), row_b = std::span(both).last(V);
    got_a.logits.insert(got_a.logits.end(), row_a.begin(), row_a.end());
    got_b.logits.insert(got_b.logits.end(), row_b.begin(), row_b.end());
    next = {argmax(row_a), argmax(row_b)};
  }
  EXPECT_EQ(got_a.tokens, want_a.tokens);
  EXPECT_EQ(got_b.tokens, want_b.tokens);
  EXPECT_EQ(got_a.logits, want_a.logits);
  EXPECT_EQ(got_b.logits, want_b.logits);
  const std::vector<int32_t> shared(a.block_table.begin(), a.block_table.begin() + 4);
  m->release(a);
  m->release(b);
  for (int32_t p : shared) EXPECT_EQ(m->kv_pool().refs(p), 1);  // the tree's
  cache.clear();
  for (int32_t p : shared) EXPECT_EQ(m->kv_pool().refs(p), 0);
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
}

// a caches 2 pages; a truncates into its second (shared) page and writes there: a gets a
// private copy, so b, which adopted the cached pages, decodes exactly as it would alone.
TEST(PrefixCache, CopyOnWriteAfterTruncateIntoASharedPage) {
  auto m = load_demo();
  PrefixCache cache(*m);
  const auto V = static_cast<size_t>(m->vocab_size());
  const std::vector<int32_t> p = random_ids(40, 9);
  Sequence a, b;
  std::vector<float> out(V);
  m->prefill(a, p, out);
  cache.insert(a);
  const int32_t page1 = a.block_table[1];
  EXPECT_EQ(cache.attach(b, p), 32);
  EXPECT_EQ(m->kv_pool().refs(page1), 3);

  m->truncate(a, 20);  // inside page 1
  EXPECT_EQ(a.block_table[1], page1);
  const std::vector<int32_t> rewrite = random_ids(6, 10);
  m->prefill(a, rewrite, out);
  EXPECT_NE(a.block_table[1], page1);
  EXPECT_EQ(m->kv_pool().refs(page1), 2);  // the tree and b
  EXPECT_EQ(m->kv_pool().refs(a.block_table[1]), 1);
  // a itself: as if it had been given its 26 tokens from the start.
  const Output want_a =
      generate(*m, nullptr, concat(std::vector<int32_t>(p.begin(), p.begin() + 20), rewrite), 0);
  EXPECT_EQ(std::vector<float>(out.begin(), out.end()), want_a.logits);

  m->prefill(b, std::span(p).subspan(32), out);
  const Output want_b = generate(*m, nullptr, p, 0);
  EXPECT_EQ(std::vector<float>(out.begin(), out.end()), want_b.logits);
  m->release(a);
  m->release(b);
  const Output again = generate(*m, &cache, p, 0);  // the tree's pages are intact too
  EXPECT_EQ(again.cached, 32);
  EXPECT_EQ(again.logits, want_b.logits);
}

TEST(PrefixCache, EvictionFreesOnlyUnreferencedPagesLeastRecentlyUsedFirst) {
  auto m = load_demo(/*kv_tokens=*/16 * kPage);
  PrefixCache cache(*m);
  const std::vector<int32_t> x = random_ids(2 * kPage + 1, 11), y = random_ids(2 * kPage + 1, 12),
                             z = random_ids(2 * kPage + 1, 13);
  for (const auto* p : {&x, &y, &z}) generate(*m, &cache, *p, 0);  // 2 pages each
  EXPECT_EQ(cache.stats().pages_held, 6);
  EXPECT_EQ(m->kv_pool().free_pages(), 10);
  EXPECT_EQ(generate(*m, &cache, x, 0).cached, 32);  // x is now the most recent
  Sequence holder;                                   // y is in use
  EXPECT_EQ(cache.attach(holder, y), 32);
  EXPECT_EQ(cache.evictable_pages(), 4);

  EXPECT_EQ(cache.make_room(10), 10);  // enough already: nothing goes
  EXPECT_EQ(cache.stats().evicted_pages, 0);
  EXPECT_EQ(cache.make_room(11), 12);  // z, the least recently used, goes whole
  EXPECT_EQ(cache.stats().evicted_pages, 2);
  Sequence probe;
  EXPECT_EQ(cache.attach(probe, z), 0);
  EXPECT_EQ(cache.make_room(16), 14);  // then x; y's pages are held by `holder`
  EXPECT_EQ(cache.stats().evicted_pages, 4);
  EXPECT_EQ(cache.stats().pages_held, 2);
  EXPECT_EQ(cache.evictable_pages(), 0);
  m->release(holder);
  EXPECT_EQ(cache.evictable_pages(), 2);
  EXPECT_EQ(cache.make_room(16), 16);
  EXPECT_EQ(cache.stats().pages_held, 0);
}

// A long cached edge that a live sequence shares only in part: eviction gives back the
// pages past the shared ones, and the sequence's pages stay cached.
TEST(PrefixCache, EvictionTrimsALeafDownToThePagesInUse) {
  auto m = load_demo(/*kv_tokens=*/16 * kPage);
  PrefixCache cache(*m);
  const std::vector<int32_t> p = random_ids(6 * kPage + 1, 14);
  generate(*m, &cache, p, 0);
  Sequence holder;
  EXPECT_EQ(cache.attach(holder, std::vector<int32_t>(p.begin(), p.begin() + 2 * kPage + 5)), 32);
  EXPECT_EQ(cache.evictable_pages(), 4);
  EXPECT_EQ(cache.make_room(16), 14);
  EXPECT_EQ(cache.stats().pages_held, 2);
  m->release(holder);
  EXPECT_EQ(generate(*m, &cache, p, 0).cached, 32);
}

TEST(PrefixCache, AdaptersDoNotShareEntries) {
  LoadOptions o;
  o.n_threads = 1;
  o.kv_tokens = 256;
  auto m = Model::load("tests/data/fixtures/qwen3_f32", o);
  LoraPool& pool = m->enable_lora({.max_loras = 2, .max_rank = 16});
  pool.load("a", "tests/data/fixtures/lora/qwen3_dense/a");
  pool.load("b", "tests/data/fixtures/lora/qwen3_dense/b");
  PrefixCache cache(*m);
  std::mt19937 rng(15);
  std::vector<int32_t> p(50);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 300);  // the fixture's vocab: 392
  EXPECT_EQ(generate(*m, &cache, p, 0, "a").cached, 0);
  EXPECT_EQ(generate(*m, &cache, p, 0, "b").cached, 0);  // a's pages are not b's
  EXPECT_EQ(generate(*m, &cache, p, 0).cached, 0);       // nor the base model's
  EXPECT_EQ(cache.stats().pages_held, 9);                // 3 pages under each
  for (const char* adapter : {"a", "b", ""}) {
    const Output want = generate(*m, nullptr, p, 3, adapter);
    const Output got = generate(*m, &cache, p, 3, adapter);
    EXPECT_EQ(got.cached, 48) << adapter;
    EXPECT_EQ(got.logits, want.logits) << adapter;
  }
}

TEST(PrefixCache, StatsCountLookupsHitsAndBytes) {
  auto m = load_demo();
  PrefixCache cache(*m);
  EXPECT_TRUE(cache.enabled());
  const std::vector<int32_t> p = random_ids(50, 16);
  generate(*m, &cache, p, 0);                   // miss; caches 3 pages
  generate(*m, &cache, p, 0);                   // hit: 48 tokens
  generate(*m, &cache, random_ids(20, 17), 0);  // miss; caches 1 page
  PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.lookups, 3);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.tokens_saved, 48);
  EXPECT_EQ(s.pages_held, 4);
  EXPECT_EQ(s.snapshots_held, 0);
  EXPECT_EQ(s.bytes_held, static_cast<uint64_t>(4 * m->kv_pool().bytes_per_page()));
  EXPECT_EQ(m->kv_pool().bytes_per_page(), m->kv_pool().bytes_per_token() * kPage);
  cache.clear();
  s = cache.stats();
  EXPECT_EQ(s.pages_held, 0);
  EXPECT_EQ(s.bytes_held, 0u);
  EXPECT_EQ(s.evicted_pages, 4);
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
}

TEST(PrefixCache, DisabledOnlyCountsLookups) {
  auto m = load_demo();
  PrefixCache cache(*m, {.enabled = false});
  EXPECT_FALSE(cache.enabled());
  const std::vector<int32_t> p = random_ids(50, 18);
  generate(*m, &cache, p, 0);
  EXPECT_EQ(generate(*m, &cache, p, 0).cached, 0);
  EXPECT_EQ(cache.stats().lookups, 2);
  EXPECT_EQ(cache.stats().hits, 0);
  EXPECT_EQ(cache.stats().pages_held, 0);
  EXPECT_FALSE(cache.wants_snapshot_at(256));
}

TEST(PrefixCache, DestroyingTheCacheDropsItsReferences) {
  auto m = load_demo();
  {
    PrefixCache cache(*m);
    generate(*m, &cache, random_ids(70, 19), 0);
    EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages() - 4);
  }
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
}

TEST(PrefixCache, MisuseIsRefused) {
  auto m = load_demo();
  PrefixCache cache(*m);
  const std::vector<int32_t> p = random_ids(40, 20);
  generate(*m, &cache, p, 0);
  Sequence s;
  std::vector<float> out(static_cast<size_t>(m->vocab_size()));
  m->prefill(s, std::span(p).first(3), out);
  EXPECT_NE(error_of([&] { cache.attach(s, p); }).find("already holds 3 tokens"),
            std::string::npos);
  Sequence empty;
  EXPECT_NE(error_of([&] { cache.attach(empty, {}); }).find("empty prompt"), std::string::npos);
  m->release(s);
  // Dense models take no snapshots and have no floor to meet.
  EXPECT_FALSE(cache.wants_snapshot_at(512));
  EXPECT_THROW(PrefixCache(*m, {.marconi_alpha = -1}), Error);
}

TEST(MarconiFloor, DefaultsAndValidation) {
  // This executable never sets the floor (tests/serve/hybrid does, in its own process).
  EXPECT_EQ(marconi_min_tokens(), DEFAULT_MARCONI_MIN_TOKENS);
  EXPECT_NE(error_of([] { set_marconi_min_tokens(-1); }).find("expected >= 0"), std::string::npos);
}

// Model::adopt_prefix checks what it is given and leaves the sequence unchanged otherwise.
TEST(AdoptPrefix, RefusesBadPrefixes) {
  auto m = load_demo();
  const std::vector<int32_t> p = random_ids(32, 21);
  Sequence owner;
  std::vector<float> out(static_cast<size_t>(m->vocab_size()));
  m->prefill(owner, p, out);
  const std::vector<int32_t> pages = owner.block_table;
  const auto refused = [&](std::span<const int32_t> tokens, std::span<const int32_t> pg,
                           int64_t snapshot, const std::string& why) {
    Sequence s;
    EXPECT_NE(error_of([&] { m->adopt_prefix(s, tokens, pg, snapshot); }).find(why),
              std::string::npos)
        << why;
    EXPECT_TRUE(s.tokens.empty() && s.block_table.empty());
  };
  refused(std::span(p).first(20), pages, -1, "whole pages");
  refused({}, {}, -1, "whole pages");
  refused(p, std::vector<int32_t>{pages[0], pages[0]}, -1, "appears twice");
  refused(p, std::vector<int32_t>{pages[0], 9999}, -1, "outside the pool");
  refused(p, pages, 0, "keeps no recurrent state");
  std::vector<int32_t> bad = p;
  bad[3] = 5000;
  refused(bad, pages, -1, "outside the vocabulary");
  for (int32_t page : pages) EXPECT_EQ(m->kv_pool().refs(page), 1);  // nothing retained
  Sequence busy;
  m->prefill(busy, std::span(p).first(1), out);
  EXPECT_NE(error_of([&] { m->adopt_prefix(busy, p, pages); }).find("already holds 1 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m->save_state(owner, 0); }).find("no recurrent state"),
            std::string::npos);

  Sequence s;
  m->adopt_prefix(s, p, pages);
  EXPECT_EQ(s.tokens, p);
  EXPECT_EQ(s.block_table, pages);
  EXPECT_EQ(m->kv_pool().refs(pages[0]), 2);
  m->release(owner);
  m->release(busy);
  m->release(s);
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
}

}  // namespace
}  // namespace metrale
