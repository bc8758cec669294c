// Images through the continuous-batching scheduler on the tiny Qwen2-VL
// (tests/data/fixtures/qwen2_vl_f32): a media request equals Session::generate on the same
// MultimodalPrompt, in prefill chunks that cut through the image and beside a text stream
// (whose tokens equal its own alone); the tower's output is cached by content hash (a second
// request about the same image is not encoded again) and the prefix cache keys image rows by
// that hash: the same image adopts the cached pages, a different image with the same pad
// tokens adopts none of the image's. An image inside a multi-turn chat (chat.safetensors of
// the tiny Qwen2.5-VL and Qwen3-VL): turn 2 sent as a second request equals transformers'
// greedy tokens, its image of turn 1 is not encoded again and its cached prefix covers the
// image; a turn 2 that carries turn 1's own reply reuses its decoded rows too, and a cached
// prefix that ends inside an image hands the rest of the image's rows their tower output.
// GLM-4V and GLM-4.5V (glm4v_fixtures.py): an image request and a video request side by side
// give transformers' greedy tokens, and the video asked again comes from the caches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "engine/chat_fixture.h"
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

// A chat as a client sends it: turn 1 (an image and a question), then the whole conversation
// again with the assistant's answer and a follow-up; then a follow-up bringing a second image.
TEST(SchedulerMedia, MultiTurnChatReusesTheImage) {
  for (const char* fixture : {"qwen2_5_vl_f32", "qwen3_vl_f32"}) {
    const testing::ChatFixture f(fixture);
    auto m =
        Model::load(testing::fixture_dir(fixture),
                    {.n_threads = 2, .kv_tokens = 512, .max_rows = 16, .max_image_patches = 256});
    const auto image = static_cast<int32_t>(m->vision()->config().image_token_id);
    // The row after turn 1's image: a prefix cache hit that reaches it covers the image.
    const std::vector<int32_t> first = f.ids("turn1");
    const auto after_image =
        static_cast<int64_t>(std::find(first.rbegin(), first.rend(), image).base() - first.begin());
    // With the prefix cache, turn 2 adopts turn 1's pages through the image; without it, the
    // tower's output cache supplies the image's rows.
    for (bool prefix : {true, false}) {
      SCOPED_TRACE(::testing::Message() << fixture << " prefix cache " << prefix);
      Scheduler sched(*m, {.max_seqs = 2, .cache = {.enabled = prefix}});
      const auto turn = [&](const std::string& c) {
        const Outcome o = drain(*sched.submit(request(f.ids(c), f.images(c), 10)));
        EXPECT_EQ(o.error, "") << c;
        EXPECT_EQ(o.tokens, f.greedy(c)) << c;
        if (prefix && c != "turn1") {
          EXPECT_GE(o.usage.cached_tokens, after_image) << c;
        }
        std::this_thread::sleep_for(50ms);
        return sched.stats();
      };
      SchedulerStats st = turn("turn1");
      EXPECT_EQ(st.media_encoded, 1);
      EXPECT_EQ(st.media_cache_hits, 0);
      // Turn 2: turn 1's image is not encoded again.
      st = turn("followup");
      EXPECT_EQ(st.media_items, 2);
      EXPECT_EQ(st.media_encoded, 1);
      EXPECT_EQ(st.media_cache_hits, 1);
      // A turn 2 with a second image: only the new one goes through the tower.
      st = turn("second_image");
      EXPECT_EQ(st.media_items, 4);
      EXPECT_EQ(st.media_encoded, 2);
      EXPECT_EQ(st.media_cache_hits, 2);
    }
  }
}

// Without the tower cache (--vision-cache-mb 0) turn 2 still runs no tower pass for turn 1's
// image: its rows all lie inside the adopted prefix. The second image goes through the tower
// (a recompute that later needs a skipped image encodes it then: vision_parity_test's
// EncodingSkipsItemsInsideACachedPrefix).
TEST(SchedulerMedia, AnImageInsideTheCachedPrefixIsNotEncoded) {
  const testing::ChatFixture f("qwen2_5_vl_f32");
  auto m =
      Model::load(testing::fixture_dir("qwen2_5_vl_f32"),
                  {.n_threads = 2, .kv_tokens = 512, .max_rows = 16, .max_image_patches = 256});
  Scheduler sched(*m, {.max_seqs = 2, .vision_cache_bytes = 0});
  for (const std::string c : testing::ChatFixture::kCases) {
    const Outcome o = drain(*sched.submit(request(f.ids(c), f.images(c), 10)));
    EXPECT_EQ(o.tokens, f.greedy(c)) << c;
  }
  std::this_thread::sleep_for(50ms);
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.media_items, 4);
  EXPECT_EQ(st.media_encoded, 2);  // turn 1's image once, the second image once
}

// Turn 2 as a chat client sends it back: turn 1's prompt, its reply (here 40 greedy tokens, so
// decoded rows fill whole pages), then the next user turn. The prefix cache supplies turn 1's
// prompt and decoded rows (decode rotated them at p + rope_delta, as get_rope_index places text
// after the image), and the reply equals a fresh run of the same prompt.
TEST(SchedulerMedia, TurnTwoReusesTurnOnesDecodedRows) {
  for (const char* fixture : {"qwen2_5_vl_f32", "qwen3_vl_f32"}) {
    SCOPED_TRACE(fixture);
    const testing::ChatFixture f(fixture);
    auto m =
        Model::load(testing::fixture_dir(fixture),
                    {.n_threads = 2, .kv_tokens = 512, .max_rows = 16, .max_image_patches = 256});
    Scheduler sched(*m, {.max_seqs = 2});
    std::vector<int32_t> ids = f.ids("turn1");
    const int64_t n_first = static_cast<int64_t>(ids.size());
    const Outcome first = drain(*sched.submit(request(ids, f.images("turn1"), 40)));
    ids.insert(ids.end(), first.tokens.begin(), first.tokens.end());
    const std::vector<int32_t> next = m->tokenizer()->encode(
        "<|im_end|>\n<|im_start|>user\nWhat colour is it?<|im_end|>\n<|im_start|>assistant\n",
        false);
    ids.insert(ids.end(), next.begin(), next.end());
    const std::vector<int32_t> want = alone(*m, ids, f.images("turn1"), 10);
    const Outcome o = drain(*sched.submit(request(ids, f.images("turn1"), 10)));
    EXPECT_EQ(o.tokens, want);
    EXPECT_GE(o.usage.cached_tokens, n_first + 16);  // at least one page of decoded rows
  }
}

// A cached prefix that ends inside an image (its page boundary cuts the 12 pad rows, at each
// offset of the pads against the page): the second request's prefill starts mid-image, with the
// tower output of the rows it computes, and equals the request alone.
TEST(SchedulerMedia, ACachedPrefixEndingInsideAnImage) {
  const Tower tower;
  auto m =
      Model::load(testing::fixture_dir("qwen2_vl_f32"),
                  {.n_threads = 2, .kv_tokens = 512, .max_rows = 16, .max_image_patches = 256});
  const int64_t page = m->kv_pool().layout().page_size;
  for (int32_t text = 3; text < 14; text += 3) {
    std::vector<int32_t> ids = {1};
    for (int32_t i = 0; i < text; ++i) ids.push_back(5 + i);
    ids.push_back(252);
    ids.insert(ids.end(), 12, 250);
    ids.insert(ids.end(), {253, 40});
    const int64_t pads = text + 2;  // the first pad row
    const std::vector<int32_t> want = alone(*m, ids, {tower.item(0)});
    Scheduler sched(*m, {.max_seqs = 2});
    EXPECT_EQ(drain(*sched.submit(request(ids, {tower.item(0)}))).tokens, want) << text;
    const Outcome o = drain(*sched.submit(request(ids, {tower.item(0)})));
    EXPECT_EQ(o.tokens, want) << text;
    EXPECT_EQ(o.usage.cached_tokens, page) << text;
    EXPECT_GT(page, pads) << text;
    EXPECT_LT(page, pads + 12) << text;  // inside the image
  }
}

// The tiny GLM-4V / GLM-4.5V through the scheduler: the one_image case (tower.safetensors) and
// the video case (video.safetensors: anim.gif's frames as the processor prepared them, each
// frame image tokens inside <|begin_of_video|>) side by side in 16-row prefill chunks, each
// equal to transformers' 10 greedy tokens; the video again adopts its cached prefix and the
// tower's cached output.
TEST(SchedulerMedia, Glm4vImageAndVideoEqualTransformers) {
  for (const char* fixture : {"glm4v_f32", "glm4v_moe_f32"}) {
    SCOPED_TRACE(fixture);
    const Tower tower(fixture);
    const SafetensorsFile video_ref =
        SafetensorsFile::open(testing::fixture_dir(fixture) + "/video.safetensors");
    auto video_get = [&](const std::string& key, auto zero) {
      const auto& t = video_ref.at(key);
      std::vector<decltype(zero)> out(static_cast<size_t>(t.shape.numel()));
      std::memcpy(out.data(), video_ref.bytes(t).data(), out.size() * sizeof(zero));
      return out;
    };
    vision::VisionItem video;
    video.kind = vision::VisionKind::kVideo;
    const std::vector<int64_t> grid = video_get("video_grid_thw", int64_t{});
    ASSERT_EQ(grid.size(), 3u);
    video.grid_thw = {grid[0], grid[1], grid[2]};
    video.patch_dim = 96;
    video.pixels = video_get("pixel_values_videos", float{});
    const std::vector<int64_t> video_wide = video_get("ids", int64_t{});
    const std::vector<int32_t> video_ids(video_wide.begin(), video_wide.end());
    const std::vector<int64_t> video_greedy = video_get("greedy", int64_t{});
    const std::vector<int64_t> image_greedy = tower.get<int64_t>("one_image.greedy");

    auto m =
        Model::load(testing::fixture_dir(fixture),
                    {.n_threads = 2, .kv_tokens = 512, .max_rows = 16, .max_image_patches = 256});
    Scheduler sched(*m, {.max_seqs = 4});
    auto a = sched.submit(request(tower.ids("one_image"), {tower.item(0)}, 10));
    auto v = sched.submit(request(video_ids, {video}, 10));
    const Outcome oa = drain(*a), ov = drain(*v);
    EXPECT_EQ(oa.error, "");
    EXPECT_EQ(ov.error, "");
    EXPECT_EQ(oa.tokens, std::vector<int32_t>(image_greedy.begin(), image_greedy.end()));
    EXPECT_EQ(ov.tokens, std::vector<int32_t>(video_greedy.begin(), video_greedy.end()));
    const Outcome again = drain(*sched.submit(request(video_ids, {video}, 10)));
    EXPECT_EQ(again.tokens, ov.tokens);
    EXPECT_GT(again.usage.cached_tokens, 0);
    std::this_thread::sleep_for(50ms);
    const SchedulerStats st = sched.stats();
    EXPECT_EQ(st.media_items, 3);
    EXPECT_LE(st.media_encoded, 2);
  }
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
