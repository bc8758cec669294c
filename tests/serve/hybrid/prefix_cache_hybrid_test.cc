// The prefix cache on a hybrid model (tests/data/fixtures/qwen3_next_f32: Gated DeltaNet and
// attention layers; a context of 256 tokens, pages of 16): a prefix is resumed from a state
// snapshot, bit for bit as without the cache, never below Marconi's floor, and snapshot blocks
// go to the highest utility.
//
// Its own executable: the floor is set once per process, and this one sets it to 32 tokens
// (the default of 256 would leave nothing to test in a context of 256).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "../prefix_test_util.h"
#include "serve/prefix_cache.h"
#include "serve/scheduler.h"
#include "support/test_support.h"
#include "test_floor.h"

namespace metrale {
namespace {

using test::error_of;

constexpr int64_t kPage = 16;
constexpr int64_t kFloor = serve_test::kHybridFloor;

// Every test starts here, before it makes a cache.
void use_test_floor() { serve_test::use_hybrid_test_floor(); }

std::unique_ptr<Model> load(int64_t snapshots = 2) {
  LoadOptions o;
  o.n_threads = 1;
  o.kv_tokens = 256;
  o.state_snapshots = snapshots;
  return Model::load("tests/data/fixtures/qwen3_next_f32", o);
}

using serve_test::argmax;
using serve_test::concat;
using serve_test::Output;

std::vector<int32_t> random_ids(size_t n, uint32_t seed) {
  return serve_test::random_ids(n, seed, 300);  // the fixture's vocabulary is 392
}

// The prompt (prefill chunks ending at `stops`, where the cache records a snapshot, as the
// scheduler does), then `n_new` greedy tokens; the sequence is released at the end.
Output generate(Model& m, PrefixCache* cache, const std::vector<int32_t>& prompt, int n_new,
                std::vector<int64_t> stops = {}) {
  return serve_test::generate(m, cache, prompt, n_new,
                              {.stops = std::move(stops), .insert_at_end = false});
}

// What attach() adopts for `prompt` (the sequence released at once: no pages needed).
int64_t probe(Model& m, PrefixCache& cache, const std::vector<int32_t>& prompt) {
  Sequence s;
  const int64_t n = cache.attach(s, prompt);
  m.release(s);
  return n;
}

TEST(HybridPrefixCache, SnapshotRestoreGivesTheLogitsOfNoCache) {
  use_test_floor();
  auto m = load();
  PrefixCache cache(*m);
  EXPECT_TRUE(cache.wants_snapshot_at(64));
  const std::vector<int32_t> p = random_ids(100, 1);
  EXPECT_EQ(generate(*m, &cache, p, 4, {64}).cached, 0);
  EXPECT_EQ(cache.stats().pages_held, 4);
  EXPECT_EQ(cache.stats().snapshots_held, 1);
  // Diverging at token 70: the snapshot at 64 is the deepest usable point.
  const std::vector<int32_t> q =
      concat(std::vector<int32_t>(p.begin(), p.begin() + 70), random_ids(20, 2));
  for (const auto* prompt : {&p, &q}) {
    const Output want = generate(*m, nullptr, *prompt, 5);
    const Output got = generate(*m, &cache, *prompt, 5);
    EXPECT_EQ(got.cached, 64);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.logits, want.logits);  // bitwise
  }
  // The restored sequence's state floor is where it resumed: rollback below it is refused.
  Sequence s;
  EXPECT_EQ(cache.attach(s, q), 64);
  EXPECT_EQ(s.state_floor, 64);
  EXPECT_THROW(m->truncate(s, 63), Error);
  m->release(s);
}

TEST(HybridPrefixCache, NoRestoreBelowTheFloorNorAwayFromASnapshot) {
  use_test_floor();
  auto m = load();
  PrefixCache cache(*m);
  EXPECT_EQ(marconi_min_tokens(), kFloor);
  EXPECT_NE(error_of([] { set_marconi_min_tokens(64); }).find("already set (to 32)"),
            std::string::npos);
  EXPECT_FALSE(cache.wants_snapshot_at(0));
  EXPECT_FALSE(cache.wants_snapshot_at(16));  // below the floor
  EXPECT_FALSE(cache.wants_snapshot_at(40));  // not a page boundary
  EXPECT_TRUE(cache.wants_snapshot_at(32));
  const std::vector<int32_t> p = random_ids(60, 3);
  generate(*m, &cache, p, 0, {16});  // a chunk ending at 16: nothing worth a snapshot
  EXPECT_EQ(cache.stats().pages_held, 0);
  EXPECT_EQ(cache.stats().snapshots_held, 0);
  generate(*m, &cache, p, 0, {32});
  EXPECT_EQ(cache.stats().pages_held, 2);
  EXPECT_EQ(cache.stats().snapshots_held, 1);
  // Page 0 alone matches: a dense model would adopt it; a hybrid one has no state there.
  const std::vector<int32_t> short_match =
      concat(std::vector<int32_t>(p.begin(), p.begin() + 20), random_ids(30, 4));
  EXPECT_EQ(probe(*m, cache, short_match), 0);
  const std::vector<int32_t> deep_match =
      concat(std::vector<int32_t>(p.begin(), p.begin() + 40), random_ids(10, 5));
  EXPECT_EQ(probe(*m, cache, deep_match), 32);
  // A chunk that ends off a page boundary records nothing.
  const std::vector<int32_t> other = random_ids(60, 6);
  generate(*m, &cache, other, 0, {40});
  EXPECT_EQ(cache.stats().pages_held, 2);
}

// Two snapshot blocks, three snapshots: b (deep, 128 tokens, the oldest), a (32), then c (48)
// needs a block. By recency alone (alpha 0) b's goes; weighted by the FLOPs per byte its
// depth saves (alpha large), a's goes, though it is newer.
TEST(HybridPrefixCache, SnapshotsAreEvictedByMarconiUtility) {
  use_test_floor();
  const std::vector<int32_t> a = random_ids(40, 7), b = random_ids(140, 8), c = random_ids(60, 9);
  for (const double alpha : {0.0, 100.0}) {
    auto m = load(/*snapshots=*/2);
    PrefixCache cache(*m, {.marconi_alpha = alpha});
    generate(*m, &cache, b, 0, {128});
    generate(*m, &cache, a, 0, {32});
    EXPECT_EQ(cache.stats().snapshots_held, 2);
    generate(*m, &cache, c, 0, {48});
    EXPECT_EQ(cache.stats().snapshots_held, 2) << alpha;
    EXPECT_EQ(cache.stats().evicted_snapshots, 1) << alpha;
    EXPECT_EQ(probe(*m, cache, c), 48) << alpha;
    const bool b_kept = alpha > 0;
    EXPECT_EQ(probe(*m, cache, b), b_kept ? 128 : 0) << alpha;
    EXPECT_EQ(probe(*m, cache, a), b_kept ? 0 : 32) << alpha;
    // The pages left without a snapshot are useless to a hybrid model: they go first.
    const int64_t lost = b_kept ? 2 : 8;
    const int64_t free = m->kv_pool().free_pages();
    EXPECT_EQ(cache.make_room(free + lost), free + lost) << alpha;
    EXPECT_EQ(cache.stats().evicted_pages, lost) << alpha;
    EXPECT_EQ(cache.stats().snapshots_held, 2) << alpha;
  }
}

TEST(HybridPrefixCache, StatsCountSnapshotBytes) {
  use_test_floor();
  auto m = load();
  PrefixCache cache(*m);
  generate(*m, &cache, random_ids(70, 10), 0, {48});
  const PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.pages_held, 3);
  EXPECT_EQ(s.snapshots_held, 1);
  EXPECT_EQ(s.bytes_held, static_cast<uint64_t>(3 * m->kv_pool().bytes_per_page()) +
                              m->state_pool()->plan().block_bytes);
  cache.clear();
  EXPECT_EQ(cache.stats().evicted_snapshots, 1);
  EXPECT_EQ(cache.stats().bytes_held, 0u);
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
}

TEST(HybridPrefixCache, WithoutSnapshotBlocksNothingIsCached) {
  use_test_floor();
  auto m = load(/*snapshots=*/0);
  PrefixCache cache(*m);
  EXPECT_FALSE(cache.wants_snapshot_at(64));
  const std::vector<int32_t> p = random_ids(70, 11);
  generate(*m, &cache, p, 0, {64});
  EXPECT_EQ(generate(*m, &cache, p, 0).cached, 0);
  EXPECT_EQ(cache.stats().lookups, 2);
  EXPECT_EQ(cache.stats().pages_held, 0);
}

TEST(HybridPrefixCache, AdoptAndSaveStateRefuseMisuse) {
  use_test_floor();
  auto m = load();
  const std::vector<int32_t> p = random_ids(32, 12);
  Sequence owner, fresh;
  EXPECT_NE(error_of([&] { m->save_state(fresh, 0); }).find("no state slot"), std::string::npos);
  std::vector<float> out(static_cast<size_t>(m->vocab_size()));
  m->prefill(owner, p, out);
  EXPECT_NE(error_of([&] { m->save_state(owner, 2); }).find("snapshot 2 is out of range"),
            std::string::npos);
  m->save_state(owner, 1);
  for (int64_t bad : {int64_t{-1}, int64_t{2}}) {
    Sequence s;
    EXPECT_NE(error_of([&] {
                m->adopt_prefix(s, p, owner.block_table, bad);
              }).find("resumes from a state snapshot"),
              std::string::npos);
    EXPECT_EQ(s.state_slot, -1);
  }
  for (int32_t page : owner.block_table) EXPECT_EQ(m->kv_pool().refs(page), 1);
  Sequence s;
  m->adopt_prefix(s, p, owner.block_table, 1);
  EXPECT_GE(s.state_slot, 0);
  EXPECT_EQ(s.state_floor, 32);
  // Resumed from the snapshot: the same next logits as the sequence it was taken from.
  std::vector<float> a(out.size()), b(out.size());
  const int32_t next = argmax(out);
  Sequence* ps = &s;
  Sequence* po = &owner;
  m->decode({&ps, 1}, {&next, 1}, a);
  m->decode({&po, 1}, {&next, 1}, b);
  EXPECT_EQ(a, b);
  m->release(s);
  m->release(owner);
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
}

}  // namespace
}  // namespace metrale

namespace metrale {
namespace {

// The scheduler on a hybrid model: requests sharing a 75-token prefix. The first leaves a
// snapshot at its prompt's last page boundary (80 is past the shared part, so no use) and at
// chunk ends; the second resumes from the deepest usable one and stops its prefill where it
// leaves the tree (64, Marconi's branch point) to snapshot there; the third resumes at 64.
// Every stream equals the same request with the cache off.
TEST(HybridScheduler, MarconiBranchPointSnapshotsServeLaterRequests) {
  use_test_floor();
  const std::vector<int32_t> shared = random_ids(75, 7);
  std::vector<ServeRequest> requests;
  for (uint32_t i = 0; i < 3; ++i) {
    ServeRequest r;
    r.prompt = concat(shared, random_ids(10, 100 + i));
    r.max_tokens = 6;
    r.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  auto run = [&](bool cache_on) {
    auto m = load(/*snapshots=*/4);
    SchedulerOptions o{.max_seqs = 2, .prefill_chunk = 24};
    o.cache.enabled = cache_on;
    Scheduler sched(*m, o);
    std::vector<std::pair<std::vector<int32_t>, int64_t>> out;  // tokens, cached tokens
    for (const ServeRequest& r : requests) {
      auto s = sched.submit(r);
      std::vector<int32_t> tokens;
      int64_t cached = -1;
      std::vector<ServeEvent> events;
      while (cached < 0) {
        events.clear();
        s->next(events, std::chrono::milliseconds(100));
        for (const ServeEvent& e : events) {
          tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
          if (e.done) {
            EXPECT_EQ(e.finish, FinishReason::kLength) << e.error;
            cached = e.usage.cached_tokens;
          }
        }
      }
      out.emplace_back(tokens, cached);
    }
    return out;
  };
  const auto off = run(false);
  const auto on = run(true);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(on[i].first, off[i].first) << i;
    EXPECT_EQ(off[i].second, 0);
  }
  EXPECT_EQ(on[0].second, 0);
  EXPECT_EQ(on[1].second, 48);  // the first request's snapshot at its chunk end 48
  EXPECT_EQ(on[2].second, 64);  // the branch point the second request snapshotted
}

}  // namespace
}  // namespace metrale
