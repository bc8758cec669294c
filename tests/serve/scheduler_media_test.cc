// Images through the continuous-batching scheduler on the tiny Qwen2-VL
// (tests/data/fixtures/qwen2_vl_f32): a media request equals Session::generate on the same
// MultimodalPrompt, in prefill chunks that cut through the image and beside a text stream
// (whose tokens equal its own alone); the tower's output is cached by content hash (a second
// request about the same image is not encoded again) and the prefix cache keys image rows by
// that hash: the same image adopts the cached pages, a different image with the same pad
// tokens adopts none of the image's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "engine/fixture_util.h"
#include "engine/multimodal.h"
#include "engine/session.h"
#include "engine/tower_fixture.h"
#include "io/safetensors/file.h"
#include "serve/scheduler.h"
#include "stream_drain.h"

namespace metrale {
namespace {

using namespace std::chrono_literals;

using Tower = testing::TowerFixture;

using Outcome = serve_test::Drained;
using serve_test::drain;

constexpr int64_t kTokens = 8;

std::vector<int32_t> alone(Model& m, const std::vector<int32_t>& ids,
                           const std::vector<vision::VisionItem>& items, int64_t n = kTokens) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.ignore_eos = true;
  Session session(m);
  if (items.empty()) return session.generate(ids, o).tokens;
  return session.generate(make_multimodal_prompt(m, ids, items), o).tokens;
}

ServeRequest request(std::vector<int32_t> ids, std::vector<vision::VisionItem> items,
                     int64_t n = kTokens) {
  ServeRequest r;
  r.prompt = std::move(ids);
  r.media = std::move(items);
  r.max_tokens = n;
  r.ignore_eos = true;
  return r;
}

TEST(SchedulerMedia, ImagesRunBatchedAndCachedByContent) {
  const Tower tower;
  // max_rows 16: the 20-token prompt's prefill chunks cut through the image's 12 pad rows.
  auto m =
      Model::load(testing::fixture_dir("qwen2_vl_f32"),
                  {.n_threads = 2, .kv_tokens = 512, .max_rows = 16, .max_image_patches = 256});
  const std::vector<int32_t> ids = tower.ids("one_image");
  const std::vector<vision::VisionItem> first = {tower.item(0)}, second = {tower.item(1)};
  ASSERT_EQ(first[0].n_tokens(), second[0].n_tokens());  // the same pad tokens
  const std::vector<int32_t> text = {1, 7, 8, 9, 10, 11, 12};
  const std::vector<int32_t> want_first = alone(*m, ids, first);
  const std::vector<int32_t> want_second = alone(*m, ids, second);
  const std::vector<int32_t> want_text = alone(*m, text, {});
  const auto first_pad =
      static_cast<int64_t>(std::find(ids.begin(), ids.end(),
                                     static_cast<int32_t>(m->vision()->config().image_token_id)) -
                           ids.begin());

  Scheduler sched(*m, {.max_seqs = 4});
  const int64_t page = m->kv_pool().layout().page_size;
  {
    // An image and a text stream share steps.
    auto a = sched.submit(request(ids, first));
    auto t = sched.submit(request(text, {}));
    const Outcome oa = drain(*a), ot = drain(*t);
    EXPECT_EQ(oa.error, "");
    EXPECT_EQ(oa.tokens, want_first);
    EXPECT_EQ(ot.tokens, want_text);
  }
  {
    // The same image again: the tower's output and the prompt's pages come from the caches.
    const Outcome o = drain(*sched.submit(request(ids, first)));
    EXPECT_EQ(o.tokens, want_first);
    EXPECT_GE(o.usage.cached_tokens, (static_cast<int64_t>(ids.size()) - 1) / page * page);
    EXPECT_GT(o.usage.cached_tokens, first_pad);
  }
  {
    // Another image with the same pad tokens: no page holding an image row is adopted.
    const Outcome o = drain(*sched.submit(request(ids, second)));
    EXPECT_EQ(o.tokens, want_second);
    EXPECT_LE(o.usage.cached_tokens, first_pad);
  }
  std::this_thread::sleep_for(50ms);
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.media_items, 3);
  EXPECT_EQ(st.media_encoded, 2);  // the first image once, the second once
  EXPECT_EQ(st.media_cache_hits, 1);
}

// Three image streams that outgrow the KV cache together (8 pages of 16 tokens; each grows to
// 60 tokens): the youngest is preempted and recomputed with its image (its tower output kept),
// and every stream equals its run alone.
TEST(SchedulerMedia, PreemptionKeepsTheMedia) {
  const Tower tower;
  auto m = Model::load(testing::fixture_dir("qwen2_vl_f32"),
                       {.n_threads = 2, .kv_tokens = 128, .max_image_patches = 256});
  const std::vector<int32_t> ids = tower.ids("one_image");
  const int64_t n = 60 - static_cast<int64_t>(ids.size());
  const size_t which[3] = {0, 1, 0};
  std::vector<std::vector<int32_t>> want;
  for (size_t i : which) want.push_back(alone(*m, ids, {tower.item(i)}, n));
  Scheduler sched(*m, {.max_seqs = 3});
  // Queued together, so the three are admitted together and must outgrow the 128-token pool
  // (one by one, a late third could wait for the first two to end and never preempt one).
  std::vector<ServeRequest> rs;
  for (size_t i : which) rs.push_back(request(ids, {tower.item(i)}, n));
  std::vector<std::shared_ptr<ServeStream>> streams = sched.submit_all(std::move(rs));
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(drain(*streams[k]).tokens, want[k]) << k;
  std::this_thread::sleep_for(50ms);
  const SchedulerStats st = sched.stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.media_items, 3);
  EXPECT_EQ(st.media_encoded, 2);  // each image once: the cache, and no re-encode on recompute
}

TEST(SchedulerMedia, BadMediaRequestsAreRefused) {
  const Tower tower;
  auto m = Model::load(testing::fixture_dir("qwen2_vl_f32"),
                       {.n_threads = 1, .kv_tokens = 256, .max_image_patches = 256});
  Scheduler sched(*m, {});
  const std::vector<int32_t> ids = tower.ids("one_image");
  // Two items for one run of placeholders.
  try {
    sched.submit(request(ids, {tower.item(0), tower.item(1)}));
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 image grids given"), std::string::npos) << e.what();
  }
  // Pads without their item.
  EXPECT_THROW(sched.submit(request(std::vector<int32_t>{1, 252, 250, 253}, {tower.item(0)})),
               Error);
  // The server keeps serving.
  EXPECT_EQ(drain(*sched.submit(request(ids, {tower.item(0)}))).error, "");
}

}  // namespace
}  // namespace metrale
