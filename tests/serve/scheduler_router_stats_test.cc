// What the scheduler publishes for routers (http/worker_api.h turns it into vLLM's gauges):
// pages the prefix cache could give back, the adapters of the running and the waiting requests,
// the LoRA pool's size; and flush_prefix_cache(), which drops what no request uses.
#include <gtest/gtest.h>

#include <thread>

#include "lora/lora_pool.h"
#include "serve/scheduler.h"

namespace metrale {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Model> load_demo() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 1024;
  o.max_rows = 64;
  return Model::load("models/demo", o);
}

// Waits up to 30 s for `ready` (a guard against hanging, not a timing assertion).
template <typename F>
bool eventually(F&& ready) {
  for (int i = 0; i < 3000; ++i) {
    if (ready()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

void drain(ServeStream& s) {
  std::vector<ServeEvent> events;
  ASSERT_TRUE(eventually([&] {
    s.next(events, 1ms);
    return !events.empty() && events.back().done;
  }));
}

ServeRequest request(std::vector<int32_t> prompt, int64_t max_tokens, std::string adapter = "") {
  ServeRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.adapter = std::move(adapter);
  r.timeout = 120s;
  return r;
}

TEST(SchedulerRouterStats, CachedPagesAreEvictableAndAFlushFreesThem) {
  std::unique_ptr<Model> model = load_demo();
  Scheduler s(*model, {.max_seqs = 2});
  const SchedulerStats idle = s.stats();
  EXPECT_EQ(idle.kv_page_tokens, 16);
  EXPECT_TRUE(idle.prefix_cache);
  EXPECT_EQ(idle.max_loras, 0);
  // A finished request of 40 prompt tokens leaves its whole pages in the cache: not free, but
  // only the cache holds them.
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i + 1);
  auto done = s.submit(request(prompt, 9));
  drain(*done);
  ASSERT_TRUE(eventually([&] { return s.stats().running == 0; }));
  const SchedulerStats cached = s.stats();
  EXPECT_GT(cached.cache.pages_held, 0);
  EXPECT_EQ(cached.kv_pages_evictable, cached.cache.pages_held);
  EXPECT_EQ(cached.kv_pages_free + cached.kv_pages_evictable, cached.kv_pages_total);

  EXPECT_EQ(s.flush_prefix_cache(30s), cached.cache.pages_held);
  ASSERT_TRUE(eventually([&] { return s.stats().cache.pages_held == 0; }));
  const SchedulerStats flushed = s.stats();
  EXPECT_EQ(flushed.kv_pages_evictable, 0);
  EXPECT_EQ(flushed.kv_pages_free, flushed.kv_pages_total);
  EXPECT_EQ(s.flush_prefix_cache(30s), 0) << "nothing left to flush";
}

TEST(SchedulerRouterStats, RunningAndWaitingAdaptersAreListed) {
  std::unique_ptr<Model> model = load_demo();
  model->enable_lora({.max_loras = 1, .max_rank = 8})
      .load("scribe", "tests/data/fixtures/lora/demo/scribe", /*pinned=*/true);
  Scheduler s(*model, {.max_seqs = 1});
  auto running = s.submit(request({1, 2, 3}, 1000, "scribe"));
  ASSERT_TRUE(eventually([&] { return s.stats().running == 1; }));
  auto base = s.submit(request({1, 2, 3}, 4));
  auto waiting = s.submit(request({4, 5, 6}, 4, "scribe"));
  // Published at the engine's next step boundary (submit() counts the queue at once).
  ASSERT_TRUE(eventually([&] { return !s.stats().waiting_adapters.empty(); }));
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.waiting, 2);
  EXPECT_EQ(st.max_loras, 1);
  EXPECT_EQ(st.running_adapters, std::vector<std::string>{"scribe"});
  EXPECT_EQ(st.waiting_adapters, std::vector<std::string>{"scribe"}) << "listed once, base not";
  running->cancel();
  drain(*base);
  drain(*waiting);
  ASSERT_TRUE(eventually([&] { return s.stats().running == 0; }));
  EXPECT_TRUE(s.stats().running_adapters.empty());
  EXPECT_TRUE(s.stats().waiting_adapters.empty());
}

}  // namespace
}  // namespace metrale
