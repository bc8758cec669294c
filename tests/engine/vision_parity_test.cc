// Images and a video through the whole tiny Qwen2-VL (tests/data/fixtures/qwen2_vl_f32), and
// images through the tiny Qwen2.5-VL (qwen2_5_vl_f32, window attention in its tower) and the
// tiny Qwen3-VL (qwen3_vl_f32: deepstack features added after its first two layers) and Qwen3.5
// (qwen3_5_vl_f32: its hybrid language model) and Qwen3-VL-MoE (qwen3_vl_moe_f32: fused experts
// in the published, transposed layout) and GLM-4V (glm4v_f32: GLM-4's sandwich-norm decoder, the
// adjacent-pair M-RoPE over half of each head; the chat text's ids, glm4v_fixtures.py) and
// GLM-4.5V (glm4v_moe_f32: GLM-4.5's sigmoid-routed experts, rotate_half M-RoPE): the
// tower's features replace the placeholder rows, M-RoPE positions come from get_rope_index's
// equal, and the prompt's logits match transformers' forward within 1e-4 while 10 greedy tokens
// equal transformers' generate. Prefill in chunks that cut through the placeholders; bad media
// refused. A video (tests/data/vision/images/anim.gif) through Qwen2.5-VL (its time axis scaled
// by second_per_grid_ts), Qwen3-VL and Qwen3.5 (a timestamp before each frame), GLM-4V and
// GLM-4.5V (each frame image tokens inside <|begin_of_video|>, its integer second after it; the
// tower's attention per frame): preprocessing, the prompt's ids, logits and greedy tokens equal the
// processor's and the model's (video.safetensors, tools/fixtures/models/vision_video_fixtures.py
// and glm4v_fixtures.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "checkpoint_copy.h"
#include "engine/multimodal.h"
#include "fixture_util.h"
#include "io/safetensors/file.h"
#include "support/test_support.h"
#include "tower_fixture.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/video.h"
#include "vision/video_sampling.h"

namespace metrale {
namespace {

constexpr const char* kFixture = "qwen2_vl_f32";

using Tower = testing::TowerFixture;

std::unique_ptr<Model> load(int64_t max_rows, const std::string& fixture = kFixture) {
  return Model::load(
      testing::fixture_dir(fixture),
      {.n_threads = 2, .kv_tokens = 256, .max_rows = max_rows, .max_image_patches = 256});
}

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

struct Case {
  const char* fixture;
  const char* name;
  std::vector<size_t> items;
};

TEST(VisionParity, LogitsAndGreedyEqualTransformers) {
  for (const Case& c :
       {Case{"qwen2_vl_f32", "one_image", {0}}, Case{"qwen2_vl_f32", "two_images_video", {0, 1, 2}},
        Case{"qwen2_5_vl_f32", "one_image", {0}}, Case{"qwen2_5_vl_f32", "two_images", {0, 1}},
        Case{"qwen3_vl_f32", "one_image", {0}}, Case{"qwen3_vl_f32", "two_images", {0, 1}},
        Case{"qwen3_5_vl_f32", "one_image", {0}}, Case{"qwen3_5_vl_f32", "two_images", {0, 1}},
        Case{"qwen3_vl_moe_f32", "one_image", {0}}, Case{"qwen3_vl_moe_f32", "two_images", {0, 1}},
        Case{"glm4v_f32", "one_image", {0}}, Case{"glm4v_f32", "two_images", {0, 1}},
        Case{"glm4v_moe_f32", "one_image", {0}}, Case{"glm4v_moe_f32", "two_images", {0, 1}}}) {
    const Tower tower(c.fixture);
    for (int64_t max_rows : {int64_t{64}, int64_t{16}}) {  // one chunk; chunks cutting the media
      SCOPED_TRACE(::testing::Message() << c.fixture << " " << c.name << " max_rows " << max_rows);
      auto m = load(max_rows, c.fixture);
      ASSERT_NE(m->vision(), nullptr);
      const std::vector<int64_t> wide = tower.get<int64_t>(std::string(c.name) + ".ids");
      const std::vector<int32_t> ids(wide.begin(), wide.end());
      std::vector<vision::VisionItem> items;
      for (size_t i : c.items) items.push_back(tower.item(i));
      const MultimodalPrompt p = make_multimodal_prompt(*m, ids, items);
      EXPECT_EQ(p.rope_delta, tower.get<int64_t>(std::string(c.name) + ".rope_delta")[0]);
      const int64_t V = m->vocab_size(), n = static_cast<int64_t>(ids.size());
      std::vector<float> logits(static_cast<size_t>(n * V));
      Sequence seq;
      prefill_multimodal(*m, seq, p, logits, /*all_logits=*/true);
      const std::vector<float> want = tower.get<float>(std::string(c.name) + ".logits");
      ASSERT_EQ(want.size(), logits.size());
      EXPECT_LE(testing::max_abs_diff(logits.data(), want.data(), want.size()), 1e-4f);
      // Greedy: decode rows rotate by p + rope_delta on every axis, as generate's positions.
      const std::vector<int64_t> greedy = tower.get<int64_t>(std::string(c.name) + ".greedy");
      std::vector<int32_t> got = {argmax(logits.data() + (n - 1) * V, V)};
      std::vector<float> step(static_cast<size_t>(V));
      while (got.size() < greedy.size()) {
        Sequence* s = &seq;
        m->decode({&s, 1}, std::span(got).last(1), step);
        got.push_back(argmax(step.data(), V));
      }
      EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.end()));
      m->release(seq);
    }
  }
}

// encode_multimodal_prompt from a row: items whose placeholder rows all lie before it (a cached
// prefix holds them) get no tower pass and zero rows; a later call from an earlier row (a
// preempted stream's recompute) encodes them, and the rows equal one full encoding. A cache hit
// fills an item without the tower.
TEST(VisionParity, EncodingSkipsItemsInsideACachedPrefix) {
  const Tower tower;
  auto m = load(64);
  const std::vector<int32_t> ids = tower.ids("two_images_video");
  const std::vector<vision::VisionItem> items = {tower.item(0), tower.item(1), tower.item(2)};
  const MultimodalPrompt full = make_multimodal_prompt(*m, ids, items);
  const int64_t H = m->injected_cols();
  const size_t second = 12;  // the second image's first row of embeds (the first holds 12)
  MultimodalPrompt p = plan_multimodal_prompt(*m, ids, items);
  // From the second image's last row: the first image is skipped.
  const int64_t from = p.embed_rows[second + 11];
  EXPECT_EQ(encode_multimodal_prompt(*m, p, items, nullptr, {}, from), 2);
  EXPECT_EQ(p.encoded, (std::vector<bool>{false, true, true}));
  ASSERT_EQ(p.embeds.size(), full.embeds.size());
  const auto at = static_cast<ptrdiff_t>(second * static_cast<size_t>(H));
  EXPECT_TRUE(std::all_of(p.embeds.begin(), p.embeds.begin() + at, [](float v) { return v == 0; }));
  EXPECT_TRUE(std::equal(p.embeds.begin() + at, p.embeds.end(), full.embeds.begin() + at));
  // Again from there: nothing to do. From row 0: the first image alone.
  EXPECT_EQ(encode_multimodal_prompt(*m, p, items, nullptr, {}, from), 0);
  EXPECT_EQ(encode_multimodal_prompt(*m, p, items), 1);
  EXPECT_EQ(p.embeds, full.embeds);
  // Through a cache: the first pass fills it, the second hits for every item.
  VisionEmbedCache cache(size_t{1} << 20);
  std::vector<uint64_t> hashes;
  for (const auto& it : items) hashes.push_back(media_hash(it));
  MultimodalPrompt a = plan_multimodal_prompt(*m, ids, items), b = a;
  EXPECT_EQ(encode_multimodal_prompt(*m, a, items, &cache, hashes), 3);
  EXPECT_EQ(encode_multimodal_prompt(*m, b, items, &cache, hashes), 0);
  EXPECT_EQ(b.embeds, full.embeds);
  EXPECT_EQ(cache.hits, 3);
}

// video.safetensors of a fixture: the processor's and the model's outputs for anim.gif.
class VideoRef {
 public:
  explicit VideoRef(const std::string& fixture)
      : file_(SafetensorsFile::open(testing::fixture_dir(fixture) + "/video.safetensors")) {}
  template <class T>
  std::vector<T> get(const std::string& key) const {
    const auto& t = file_.at(key);
    std::vector<T> out(static_cast<size_t>(t.shape.numel()));
    std::memcpy(out.data(), file_.bytes(t).data(), out.size() * sizeof(T));
    return out;
  }
  bool has(const std::string& key) const { return file_.find(key) != nullptr; }
  std::string text() const { return file_.metadata().at("text"); }

 private:
  SafetensorsFile file_;
};

// anim.gif as `generate --video` reads it, preprocessed by the fixture's video processor.
vision::VisionItem gif_video(const std::string& fixture) {
  const vision::VideoFrames frames = vision::decode_video_file("tests/data/vision/images/anim.gif");
  return vision::preprocess_video(
      frames.frames, frames.fps,
      vision::load_video_processor_config(testing::fixture_dir(fixture)));
}

TEST(VisionParity, VideosEqualTransformers) {
  for (const char* fixture :
       {"qwen2_5_vl_f32", "qwen3_vl_f32", "qwen3_5_vl_f32", "glm4v_f32", "glm4v_moe_f32"}) {
    const VideoRef ref(fixture);
    // Preprocessing: the processor's pixel_values_videos and grid, bit for bit.
    const vision::VisionItem video = gif_video(fixture);
    const std::vector<int64_t> grid = ref.get<int64_t>("video_grid_thw");
    ASSERT_EQ(std::vector<int64_t>(video.grid_thw.begin(), video.grid_thw.end()), grid) << fixture;
    EXPECT_EQ(video.pixels, ref.get<float>("pixel_values_videos")) << fixture;
    if (ref.has("second_per_grid_ts")) {
      EXPECT_EQ(vision::second_per_grid(video.frame_indices, video.total_frames, video.fps, 2),
                ref.get<float>("second_per_grid_ts")[0])
          << fixture;
    }
    for (int64_t max_rows : {int64_t{64}, int64_t{16}}) {
      SCOPED_TRACE(::testing::Message() << fixture << " max_rows " << max_rows);
      auto m = load(max_rows, fixture);
      ASSERT_NE(m->tokenizer(), nullptr);
      // The template's text with one video pad, expanded: the processor's input_ids.
      const std::vector<int32_t> text = m->tokenizer()->encode(ref.text(), false);
      std::vector<vision::VisionItem> items = {video};
      const std::vector<int32_t> ids =
          place_media(m->vision()->config(), text, items, -1, m->tokenizer());
      const std::vector<int64_t> want_ids = ref.get<int64_t>("ids");
      ASSERT_EQ(ids, std::vector<int32_t>(want_ids.begin(), want_ids.end()));
      const MultimodalPrompt p = make_multimodal_prompt(*m, ids, items);
      EXPECT_EQ(p.rope_delta, ref.get<int64_t>("rope_delta")[0]);
      const int64_t V = m->vocab_size(), n = static_cast<int64_t>(ids.size());
      std::vector<float> logits(static_cast<size_t>(n * V));
      Sequence seq;
      prefill_multimodal(*m, seq, p, logits, /*all_logits=*/true);
      const std::vector<float> want = ref.get<float>("logits");
      ASSERT_EQ(want.size(), logits.size());
      EXPECT_LE(testing::max_abs_diff(logits.data(), want.data(), want.size()), 1e-4f);
      const std::vector<int64_t> greedy = ref.get<int64_t>("greedy");
      std::vector<int32_t> got = {argmax(logits.data() + (n - 1) * V, V)};
      std::vector<float> step(static_cast<size_t>(V));
      while (got.size() < greedy.size()) {
        Sequence* s = &seq;
        m->decode({&s, 1}, std::span(got).last(1), step);
        got.push_back(argmax(step.data(), V));
      }
      EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.end()));
      m->release(seq);
    }
  }
}

// Qwen3-VL's prompt text around a video, as processing_qwen3_vl.py writes it: a timestamp
// (rounded as Python's format) before each frame's vision_start, pads, vision_end; a prompt
// without pads gets the template's vision_start, video, vision_end in front.
TEST(VisionParity, Qwen3VideoTimestampsAreThePromptsText) {
  EXPECT_EQ(vision::timestamp_text(0.05), "<0.1 seconds>");  // 0.05000000000000000277
  EXPECT_EQ(vision::timestamp_text(0.35), "<0.3 seconds>");  // 0.34999999999999997780
  EXPECT_EQ(vision::timestamp_text(12.25), "<12.2 seconds>");
  auto m = load(64, "qwen3_vl_f32");
  const VisionConfig& c = m->vision()->config();
  const std::vector<vision::VisionItem> items = {gif_video("qwen3_vl_f32")};
  const std::vector<int32_t> front =
      expand_placeholders(c, std::vector<int32_t>{40}, items, -1, m->tokenizer());
  std::vector<int32_t> want = {252};
  for (const char* t : {"<0.1 seconds>", "<0.4 seconds>"}) {  // frames 0, 1 and 3, 4 at 5 / 0.55 s
    const std::vector<int32_t> text = m->tokenizer()->encode(t, false);
    want.insert(want.end(), text.begin(), text.end());
    want.push_back(252);
    want.insert(want.end(), 6, 251);
    want.push_back(253);
  }
  want.insert(want.end(), {253, 40});
  EXPECT_EQ(front, want);
  // Without a tokenizer the timestamps cannot be written.
  EXPECT_NE(test::error_of([&] {
              expand_placeholders(c, std::vector<int32_t>{251}, items);
            }).find("needs the checkpoint's tokenizer"),
            std::string::npos);
  // An image between a video's frames; a video missing its last frame's run.
  std::vector<int32_t> split = front;
  const auto first = std::find(split.begin(), split.end(), 251);
  const auto second = std::find(first + 6, split.end(), 251);  // the second frame's pads
  std::vector<vision::VisionItem> mixed = items;
  const Tower tower("qwen3_vl_f32");
  mixed.push_back(tower.item(0));
  std::vector<int32_t> with_image(split.begin(), second);
  with_image.insert(with_image.end(), 12, 250);
  with_image.insert(with_image.end(), second, split.end());
  EXPECT_NE(test::error_of([&] {
              make_multimodal_prompt(*m, with_image, mixed);
            }).find("come between frames of media item 0, a video"),
            std::string::npos);
  std::vector<int32_t> one_frame(split.begin(), second);
  EXPECT_NE(test::error_of([&] {
              make_multimodal_prompt(*m, one_frame, items);
            }).find("has 1 frame(s) without placeholders"),
            std::string::npos);
}

TEST(VisionParity, PlaceholdersExpandAsTheProcessorExpandsThem) {
  const Tower tower;
  auto m = load(64);
  const VisionConfig& c = m->vision()->config();
  const std::vector<vision::VisionItem> items = {tower.item(0), tower.item(2), tower.item(1)};
  // One pad per item (in prompt order per kind), or runs already expanded: the same prompt.
  const std::vector<int32_t> short_ids = {1, 252, 250, 253, 7, 252, 251, 253, 252, 250, 253};
  const std::vector<int32_t> got = expand_placeholders(c, short_ids, items);
  std::vector<int32_t> want = {1, 252};
  want.insert(want.end(), 12, 250);
  want.insert(want.end(), {253, 7, 252});
  want.insert(want.end(), 8, 251);  // the video: 2 frames x 4 tokens (Qwen2-VL keeps it whole)
  want.insert(want.end(), {253, 252});
  want.insert(want.end(), 12, 250);
  want.push_back(253);
  EXPECT_EQ(got, want);
  EXPECT_EQ(expand_placeholders(c, got, items), want);
  // No pads: every item before the prompt, after its bos.
  const std::vector<int32_t> text = {1, 7, 8};
  const std::vector<vision::VisionItem> one = {tower.item(0)};
  std::vector<int32_t> front = {1, 252};
  front.insert(front.end(), 12, 250);
  front.insert(front.end(), {253, 7, 8});
  EXPECT_EQ(expand_placeholders(c, text, one, 1), front);
  EXPECT_EQ(test::error_of([&] { expand_placeholders(c, short_ids, one); }),
            "prompt: more video placeholders than the 0 video(s) given");
  EXPECT_EQ(test::error_of([&] {
              expand_placeholders(c, std::vector<int32_t>{5, 250}, items);
            }),
            "prompt: 2 image(s) given for 1 placeholder(s)");
}

TEST(VisionParity, BadMediaAreRefused) {
  const Tower tower;
  auto m = load(64);
  const std::vector<int64_t> wide = tower.get<int64_t>("one_image.ids");
  const std::vector<int32_t> ids(wide.begin(), wide.end());
  // No item for the placeholders.
  EXPECT_NE(test::error_of([&] {
              make_multimodal_prompt(*m, ids, {});
            }).find("the image placeholders at token 4 have no media item (0 given)"),
            std::string::npos);
  // A video where the prompt has an image.
  const std::vector<vision::VisionItem> video = {tower.item(2)};
  EXPECT_NE(test::error_of([&] { make_multimodal_prompt(*m, ids, video); }).find("a video"),
            std::string::npos);
  // The second image has the same token count but another shape: its grid does not fit.
  std::vector<int32_t> fewer = ids;
  fewer.erase(fewer.begin() + 4);
  const std::vector<vision::VisionItem> first = {tower.item(0)};
  EXPECT_NE(test::error_of([&] {
              make_multimodal_prompt(*m, fewer, first);
            }).find("holds 11 tokens; its grid [1, 6, 8] (image grid 0) merges to 12"),
            std::string::npos);
  // A text-only model.
  auto text = Model::load(testing::fixture_dir("qwen3_f32"), {.n_threads = 1, .kv_tokens = 64});
  EXPECT_NE(test::error_of([&] {
              make_multimodal_prompt(*text, ids, first);
            }).find("has no vision tower metrale runs"),
            std::string::npos);
}

// A tower config that disagrees with its tensors, a missing and a stray tower tensor: each a load
// error naming the tensor.
TEST(VisionParity, BadTowerCheckpointsAreRefused) {
  {
    testing::CheckpointCopy c(kFixture);
    c.replace_in_config("\"embed_dim\": 32", "\"embed_dim\": 64");
    testing::expect_has(testing::load_error(c), "visual.patch_embed.proj.weight");
  }
  {
    testing::CheckpointCopy c(kFixture);
    c.replace_in_config("\"depth\": 2", "\"depth\": 1");
    testing::expect_has(testing::load_error(c), "visual.blocks.1.");
  }
  {
    testing::CheckpointCopy c(kFixture);
    c.rewrite([](const std::string& name) {
      const bool checkpoint =
          name.starts_with("visual.") || name.starts_with("model.") || name == "lm_head.weight";
      return checkpoint && name != "visual.blocks.1.mlp.fc2.bias";
    });
    testing::expect_has(testing::load_error(c), "visual.blocks.1.mlp.fc2.bias");
  }
  // Qwen3-VL: the learned position table, the deepstack mergers and the patch bias.
  {
    testing::CheckpointCopy c("qwen3_vl_f32");
    c.replace_in_config("\"num_position_embeddings\": 16", "\"num_position_embeddings\": 25");
    testing::expect_has(testing::load_error(c), "model.visual.pos_embed.weight");
  }
  {
    testing::CheckpointCopy c("qwen3_vl_f32");
    c.rewrite([](const std::string& name) {  // tower.safetensors' references dropped too
      return (name.starts_with("model.") || name == "lm_head.weight") &&
             name != "model.visual.deepstack_merger_list.1.norm.weight";
    });
    testing::expect_has(testing::load_error(c), "model.visual.deepstack_merger_list.1.norm.weight");
  }
  {
    testing::CheckpointCopy c("qwen3_vl_f32");
    c.rewrite([](const std::string& name) {
      return (name.starts_with("model.") || name == "lm_head.weight") &&
             name != "model.visual.patch_embed.proj.bias";
    });
    testing::expect_has(testing::load_error(c), "model.visual.patch_embed.proj.bias");
  }
  // Qwen3-VL-MoE's fused experts: a stack in neither layout is named with both shapes.
  {
    testing::CheckpointCopy c("qwen3_vl_moe_f32");
    c.replace_in_config("\"moe_intermediate_size\": 24", "\"moe_intermediate_size\": 20");
    testing::expect_has(testing::load_error(c),
                        "tensor 'model.language_model.layers.0.mlp.experts.gate_up_proj' has shape "
                        "[4, 32, 48], expected [4, 40, 32] (transformers' layout) or [4, 32, 40] "
                        "(the published one)");
  }
}

}  // namespace
}  // namespace metrale
