// GLM-4V and GLM-4.5V (tests/data/fixtures/glm4v_f32 and glm4v_moe_f32,
// tools/fixtures/models/glm4v_fixtures.py: a tiny random Glm4vForConditionalGeneration /
// Glm4vMoeForConditionalGeneration, the real Glm4vImageProcessorPil on two committed images, a
// synthetic tokenizer with GLM-4V's special tokens): the tower's output within 1e-4 of
// transformers' (both images in one pass, and each alone equal to its rows of the batch), its
// learned positions resampled as F.grid_sample (bicubic) does within 1e-5, the chat text's ids
// expanded as Glm4vProcessor expands them and get_rope_index's positions equal (images, and
// a video's frames with their timestamps), and a tower
// config that disagrees with its tensors refused naming the tensor and both shapes. The
// prompt's logits and greedy tokens are vision_parity_test.cc's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint_copy.h"
#include "core/thread_pool.h"
#include "engine/multimodal.h"
#include "engine/vision_encoder.h"
#include "fixture_util.h"
#include "io/safetensors/checkpoint.h"
#include "support/test_support.h"
#include "tower_fixture.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/video.h"

namespace metrale {
namespace {

constexpr const char* kFixture = "glm4v_f32";

class Glm4vTower : public ::testing::TestWithParam<const char*> {
 protected:
  Glm4vTower()
      : pool_(2),
        backend_(pool_),
        checkpoint_(Checkpoint::open(testing::fixture_dir(GetParam()))),
        loader_(checkpoint_, backend_, WeightPlacement::kCopy, nullptr),
        config_(load_vision_config(testing::fixture_dir(GetParam()))),
        ref_(GetParam()) {
    encoder_ = VisionEncoder::load(config_, loader_, backend_, "model.visual.", 256);
    const std::vector<int64_t> g = ref_.get<int64_t>("grid_thw");
    for (size_t i = 0; i + 2 < g.size(); i += 3) grids_.push_back({g[i], g[i + 1], g[i + 2]});
  }

  std::vector<float> encode(std::span<const std::array<int64_t, 3>> grids, const float* pixels,
                            int64_t n) {
    const int64_t w = encoder_->out_cols();
    std::vector<float> out(static_cast<size_t>(n / 4 * w));
    encoder_->encode(grids, ConstRows{pixels, n, config_.patch_dim(), config_.patch_dim()},
                     Rows{out.data(), n / 4, w, w});
    return out;
  }

  ThreadPool pool_;
  CpuBackend backend_;
  Checkpoint checkpoint_;
  TensorLoader loader_;
  VisionConfig config_;
  testing::TowerFixture ref_;
  std::unique_ptr<VisionEncoder> encoder_;
  std::vector<std::array<int64_t, 3>> grids_;
};

TEST_P(Glm4vTower, EqualsTransformersWithin1e4) {
  EXPECT_EQ(config_.tower, VisionTowerKind::kGlm4v);
  EXPECT_EQ(config_.mlp_width, 32);
  EXPECT_EQ(config_.merger_width, 48);
  EXPECT_EQ(config_.num_position_embeddings, 16);
  EXPECT_EQ(config_.vision_start_token_id, 252);  // image_start_token_id
  // Every tower tensor is claimed; what is left is the language model's.
  for (const CheckpointTensor& t : checkpoint_.tensors()) {
    if (!t.name().starts_with("model.visual.")) loader_.ignore(std::string(t.name()));
  }
  loader_.check_all_claimed();
  ASSERT_EQ(grids_.size(), 2u);
  EXPECT_NE(grids_[0], grids_[1]);
  const std::vector<float> pixels = ref_.get<float>("pixel_values");
  const int64_t n = static_cast<int64_t>(pixels.size()) / config_.patch_dim();
  ASSERT_EQ(n, 96);
  const std::vector<float> out = encode(grids_, pixels.data(), n);
  const std::vector<float> want = ref_.get<float>("merged");
  ASSERT_EQ(out.size(), want.size());
  EXPECT_LE(testing::max_abs_diff(out.data(), want.data(), want.size()), 1e-4f);
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::abs(v));
  EXPECT_GT(scale, 1.0f);  // O(1) outputs: a wrong op moves them by O(1)
}

TEST_P(Glm4vTower, AnItemAloneEqualsItsRowsOfTheBatch) {
  const std::vector<float> pixels = ref_.get<float>("pixel_values");
  const std::vector<float> all = encode(grids_, pixels.data(), 96);
  const int64_t w = encoder_->out_cols();
  const int64_t first = grids_[0][1] * grids_[0][2];
  const std::vector<std::array<int64_t, 3>> second = {grids_[1]};
  const std::vector<float> alone =
      encode(second, pixels.data() + first * config_.patch_dim(), 96 - first);
  EXPECT_EQ(alone, std::vector<float>(all.begin() + first / 4 * w, all.end()));
}

// Glm4vVisionEmbeddings: the 4 x 4 table resampled to each grid (6 x 8 and 8 x 6) by
// F.grid_sample(bicubic, align_corners=False, border): the pass layout's 16 taps per patch,
// summed here in double, equal transformers' resampled rows within 1e-5.
TEST_P(Glm4vTower, PositionEmbeddingsResampleAsGridSample) {
  const std::vector<float> table =
      loader_.floats("model.visual.embeddings.position_embedding.weight", {16, config_.width});
  const VisionPassLayout p = vision_pass_layout(grids_, 2, 0, 4, /*bicubic=*/true);
  ASSERT_EQ(p.pos_taps.size(), static_cast<size_t>(p.n_rows * 16));
  const std::vector<float> want = ref_.get<float>("pos_embed");
  ASSERT_EQ(want.size(), static_cast<size_t>(p.n_rows * config_.width));
  double worst = 0;
  for (int64_t r = 0; r < p.n_rows; ++r) {
    for (int64_t c = 0; c < config_.width; ++c) {
      double sum = 0;
      for (size_t k = 0; k < 16; ++k) {
        const size_t i = static_cast<size_t>(r) * 16 + k;
        sum += double{p.pos_weights[i]} *
               table[static_cast<size_t>(p.pos_taps[i] * config_.width + c)];
      }
      worst = std::max(worst, std::abs(sum - want[static_cast<size_t>(r * config_.width + c)]));
    }
  }
  EXPECT_LE(worst, 1e-5);
  // The cubic convolution's weights: a tap exactly on a sample takes it whole; they sum to 1.
  EXPECT_EQ(bicubic_weights(0.0f), (std::array<float, 4>{0.0f, 1.0f, 0.0f, 0.0f}));
  const std::array<float, 4> half = bicubic_weights(0.5f);
  EXPECT_FLOAT_EQ(half[0] + half[1] + half[2] + half[3], 1.0f);
  EXPECT_FLOAT_EQ(half[0], -0.09375f);  // A = -0.75: (A t^3 - 5 A t^2 + 8 A t - 4 A) at 1.5
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Glm4vTower, ::testing::Values("glm4v_f32", "glm4v_moe_f32"));

// The chat text of each case, tokenized and expanded (one <|image|> per merged patch), is the
// processor's input_ids; get_rope_index's (t, h, w) and delta come out equal.
void expect_prompts_equal_the_processors(const std::string& fixture) {
  const testing::TowerFixture tower(fixture);
  const SafetensorsFile file =
      SafetensorsFile::open(testing::fixture_dir(fixture) + "/tower.safetensors");
  auto m = Model::load(testing::fixture_dir(fixture),
                       {.n_threads = 1, .kv_tokens = 128, .max_image_patches = 128});
  ASSERT_NE(m->vision(), nullptr);
  ASSERT_NE(m->tokenizer(), nullptr);
  EXPECT_TRUE(m->multimodal_rope());
  for (const auto& [name, n_items] : {std::pair<std::string, size_t>{"one_image", 1},
                                      std::pair<std::string, size_t>{"two_images", 2}}) {
    SCOPED_TRACE(name);
    std::vector<vision::VisionItem> items;
    for (size_t i = 0; i < n_items; ++i) items.push_back(tower.item(i));
    const std::vector<int32_t> text = m->tokenizer()->encode(file.metadata().at(name + ".text"),
                                                             /*add_special=*/false);
    const std::vector<int32_t> ids = expand_placeholders(m->vision()->config(), text, items);
    EXPECT_EQ(ids, tower.ids(name));
    const MultimodalPrompt p = plan_multimodal_prompt(*m, ids, items);
    const std::vector<int64_t> want = tower.get<int64_t>(name + ".positions");  // [3, n]
    ASSERT_EQ(want.size(), p.positions3.size());
    const size_t n = ids.size();
    for (size_t r = 0; r < n; ++r) {
      for (size_t a = 0; a < 3; ++a)
        EXPECT_EQ(p.positions3[r * 3 + a], want[a * n + r]) << "token " << r << " axis " << a;
    }
    EXPECT_EQ(p.rope_delta, tower.get<int64_t>(name + ".rope_delta")[0]);
  }
}

// anim.gif through the fixture's Glm4vVideoProcessor (video_preprocessor_config.json: 8 fps
// sampling, 4 frames upscaled to 40 x 32): the prompt text's <|video|>, expanded per temporal
// patch (<|begin_of_image|>, its image tokens, <|end_of_image|>, the integer second), is the
// processor's input_ids; the image tokens inside <|begin_of_video|> ... <|end_of_video|> are
// video tokens, each frame a grid of its own for get_rope_index, whose (t, h, w) and delta come
// out equal (video.safetensors). Its logits and greedy tokens are vision_parity_test.cc's.
void expect_video_prompt_equals_the_processors(const std::string& fixture) {
  const SafetensorsFile ref =
      SafetensorsFile::open(testing::fixture_dir(fixture) + "/video.safetensors");
  auto get = [&](const std::string& key) {
    const auto& t = ref.at(key);
    std::vector<int64_t> out(static_cast<size_t>(t.shape.numel()));
    std::memcpy(out.data(), ref.bytes(t).data(), out.size() * sizeof(int64_t));
    return out;
  };
  auto m = Model::load(testing::fixture_dir(fixture),
                       {.n_threads = 1, .kv_tokens = 128, .max_image_patches = 256});
  const vision::VideoFrames frames = vision::decode_video_file("tests/data/vision/images/anim.gif");
  std::vector<vision::VisionItem> items = {
      vision::preprocess_video(frames.frames, frames.fps,
                               vision::load_video_processor_config(testing::fixture_dir(fixture)))};
  EXPECT_EQ(items[0].frame_indices, (std::vector<int64_t>{0, 2, 3, 4}));  // 8 fps over 0.55 s
  const std::vector<int64_t> grid = get("video_grid_thw");
  ASSERT_EQ(std::vector<int64_t>(items[0].grid_thw.begin(), items[0].grid_thw.end()), grid);
  const VisionConfig& vc = m->vision()->config();
  EXPECT_EQ(vc.video_start_token_id, 248);
  EXPECT_EQ(vc.video_end_token_id, 249);
  const std::vector<int32_t> text =
      m->tokenizer()->encode(ref.metadata().at("text"), /*add_special=*/false);
  const std::vector<int32_t> ids = place_media(vc, text, items, -1, m->tokenizer());
  const std::vector<int64_t> want_ids = get("ids");
  ASSERT_EQ(ids, std::vector<int32_t>(want_ids.begin(), want_ids.end()));
  const MultimodalPrompt p = plan_multimodal_prompt(*m, ids, items);
  const std::vector<int64_t> want = get("positions");  // [3, n]
  ASSERT_EQ(want.size(), p.positions3.size());
  const size_t n = ids.size();
  for (size_t r = 0; r < n; ++r) {
    for (size_t a = 0; a < 3; ++a)
      EXPECT_EQ(p.positions3[r * 3 + a], want[a * n + r]) << "token " << r << " axis " << a;
  }
  EXPECT_EQ(p.rope_delta, get("rope_delta")[0]);
  EXPECT_EQ(p.embed_rows.size(), 40u);  // 2 frames of 8 x 10 patches merged by 2 x 2

  // Without a placeholder the video goes in front as the chat template writes it:
  // <|begin_of_video|><|video|><|end_of_video|>, then expanded.
  const std::vector<int32_t> bare = m->tokenizer()->encode("Hi", false);
  const std::vector<int32_t> front = expand_placeholders(vc, bare, items, -1, m->tokenizer());
  ASSERT_GT(front.size(), 2u);
  EXPECT_EQ(front.front(), 248);
  EXPECT_EQ(front[1], 252);  // the first frame's <|begin_of_image|>
  EXPECT_EQ(front[front.size() - bare.size() - 1], 249);
  // A frame's second is int(t) of its first frame: frames 0, 2 of a 0.1 fps video are at 0 s
  // and 20 s.
  vision::VisionItem slow = items[0];
  slow.fps = 0.1;
  slow.frame_indices = {0, 1, 2, 3};
  const std::vector<vision::VisionItem> slow_items = {slow};
  const std::vector<int32_t> slow_ids =
      expand_placeholders(vc, text, slow_items, -1, m->tokenizer());
  const std::string spelled = m->tokenizer()->decode(slow_ids, /*skip_special_tokens=*/false);
  testing::expect_has(spelled, "<|end_of_image|>0<|begin_of_image|>");
  testing::expect_has(spelled, "<|end_of_image|>20<|end_of_video|>");
}

TEST(Glm4v, VideoPromptIdsAndPositionsEqualTheProcessors) {
  for (const char* fixture : {"glm4v_f32", "glm4v_moe_f32"}) {
    SCOPED_TRACE(fixture);
    expect_video_prompt_equals_the_processors(fixture);
  }
}

TEST(Glm4v, PromptIdsAndPositionsEqualTheProcessors) {
  for (const char* fixture : {"glm4v_f32", "glm4v_moe_f32"}) {
    SCOPED_TRACE(fixture);
    expect_prompts_equal_the_processors(fixture);
  }
}

// A tower config that disagrees with its tensors is refused at load, naming the tensor and
// both shapes.
TEST(Glm4v, ATowerConfigThatDisagreesWithItsTensorsIsRefused) {
  {  // image_size 20: a 5 x 5 position table; the checkpoint's is 4 x 4.
    testing::CheckpointCopy c(kFixture);
    c.replace_in_config("\"image_size\": 16", "\"image_size\": 20");
    const std::string msg = testing::load_error(c);
    testing::expect_has(msg, "model.visual.embeddings.position_embedding.weight");
    testing::expect_has(msg, "[25, 32]");
    testing::expect_has(msg, "[16, 32]");
  }
  {  // the merger's intermediate_size 40; its gate_proj is [48, 32].
    testing::CheckpointCopy c(kFixture);
    c.replace_in_config("\"intermediate_size\": 48", "\"intermediate_size\": 40");
    const std::string msg = testing::load_error(c);
    testing::expect_has(msg, "model.visual.merger.gate_proj.weight");
    testing::expect_has(msg, "[40, 32]");
    testing::expect_has(msg, "[48, 32]");
  }
}

}  // namespace
}  // namespace metrale
