// The Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5 vision towers against transformers
// (tests/data/fixtures/ qwen2_vl_f32, qwen2_5_vl_f32, qwen3_vl_f32 and qwen3_5_vl_f32
// /tower.safetensors, from tools/fixtures/models/
// vision_tower_fixtures.py): two images of different sizes and a two-frame video in one pass,
// the merged output (and Qwen3-VL's deepstack features) within 1e-4 absolute (f32; the values
// reach 6). Items alone equal their rows
// of the batched pass, bit for bit; bad calls are refused.
#include "engine/vision_encoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "fixture_util.h"
#include "io/safetensors/checkpoint.h"
#include "io/safetensors/file.h"
#include "support/test_support.h"

namespace metrale {
namespace {

struct TowerRef {
  explicit TowerRef(const std::string& dir)
      : file(SafetensorsFile::open(dir + "/tower.safetensors")) {}
  SafetensorsFile file;
  std::vector<float> floats(const std::string& key) const {
    const auto& t = file.at(key);
    std::vector<float> out(static_cast<size_t>(t.shape.numel()));
    std::memcpy(out.data(), file.bytes(t).data(), out.size() * sizeof(float));
    return out;
  }
  std::vector<std::array<int64_t, 3>> grids() const {
    const auto& t = file.at("grid_thw");
    std::vector<int64_t> v(static_cast<size_t>(t.shape.numel()));
    std::memcpy(v.data(), file.bytes(t).data(), v.size() * sizeof(int64_t));
    std::vector<std::array<int64_t, 3>> out;
    for (size_t i = 0; i + 2 < v.size(); i += 3) out.push_back({v[i], v[i + 1], v[i + 2]});
    return out;
  }
};

class VisionTowerTest : public ::testing::TestWithParam<const char*> {
 protected:
  VisionTowerTest()
      : dir_(std::string("tests/data/fixtures/") + GetParam()),
        pool_(2),
        backend_(pool_),
        checkpoint_(Checkpoint::open(dir_)),
        loader_(checkpoint_, backend_, WeightPlacement::kCopy, nullptr),
        config_(load_vision_config(dir_)),
        ref_(dir_) {
    // transformers 5 saves Qwen3-VL's tower under model.visual. (Qwen2-VL's: visual.).
    prefix_ =
        checkpoint_.find("visual.patch_embed.proj.weight") != nullptr ? "visual." : "model.visual.";
    encoder_ = VisionEncoder::load(config_, loader_, backend_, prefix_, 256);
  }

  std::vector<float> encode(std::span<const std::array<int64_t, 3>> grids, const float* pixels,
                            int64_t n) {
    const int64_t w = encoder_->out_cols();
    std::vector<float> out(static_cast<size_t>(n / 4 * w));
    encoder_->encode(grids, ConstRows{pixels, n, config_.patch_dim(), config_.patch_dim()},
                     Rows{out.data(), n / 4, w, w});
    return out;
  }

  std::string dir_;
  std::string prefix_;
  ThreadPool pool_;
  CpuBackend backend_;
  Checkpoint checkpoint_;
  TensorLoader loader_;
  VisionConfig config_;
  std::unique_ptr<VisionEncoder> encoder_;
  TowerRef ref_;
};

TEST_P(VisionTowerTest, EqualsTransformersWithin1e4) {
  // Every tower tensor is claimed; what is left is the language model's.
  for (const CheckpointTensor& t : checkpoint_.tensors()) {
    if (!t.name().starts_with(prefix_)) loader_.ignore(std::string(t.name()));
  }
  loader_.check_all_claimed();
  const auto grids = ref_.grids();
  ASSERT_EQ(grids.size(), 3u);
  const std::vector<float> pixels = ref_.floats("pixel_values");
  const int64_t n = static_cast<int64_t>(pixels.size()) / config_.patch_dim();
  ASSERT_EQ(n, 128);
  const std::vector<float> out = encode(grids, pixels.data(), n);
  // Columns [k out_width, (k + 1) out_width): the merger (k = 0), then deepstack k - 1.
  const int64_t w = config_.out_width, cols = encoder_->out_cols();
  ASSERT_EQ(cols, w * static_cast<int64_t>(1 + config_.deepstack_visual_indexes.size()));
  for (int64_t k = 0; k < cols / w; ++k) {
    SCOPED_TRACE(k);
    const std::vector<float> want =
        ref_.floats(k == 0 ? std::string("merged") : "deepstack." + std::to_string(k - 1));
    ASSERT_EQ(static_cast<int64_t>(want.size()), n / 4 * w);
    std::vector<float> got;
    for (int64_t r = 0; r < n / 4; ++r)
      got.insert(got.end(), out.begin() + r * cols + k * w, out.begin() + r * cols + (k + 1) * w);
    EXPECT_LE(testing::max_abs_diff(got.data(), want.data(), want.size()), 1e-4f);
    float scale = 0;
    for (float v : want) scale = std::max(scale, std::abs(v));
    EXPECT_GT(scale, 1.0f);  // O(1) outputs: a wrong op moves them by O(1)
  }
}

TEST_P(VisionTowerTest, AnItemAloneEqualsItsRowsOfTheBatch) {
  const auto grids = ref_.grids();
  const std::vector<float> pixels = ref_.floats("pixel_values");
  const std::vector<float> all = encode(grids, pixels.data(), 128);
  const int64_t w = encoder_->out_cols();
  // The second image (patches 48..95, merged rows 12..23) alone.
  const std::vector<std::array<int64_t, 3>> second = {grids[1]};
  const std::vector<float> alone = encode(second, pixels.data() + 48 * config_.patch_dim(), 48);
  EXPECT_EQ(alone, std::vector<float>(all.begin() + 12 * w, all.begin() + 24 * w));
  // The video alone.
  const std::vector<std::array<int64_t, 3>> video = {grids[2]};
  const std::vector<float> v = encode(video, pixels.data() + 96 * config_.patch_dim(), 32);
  EXPECT_EQ(v, std::vector<float>(all.begin() + 24 * w, all.end()));
}

TEST_P(VisionTowerTest, BadCallsAreRefused) {
  const std::vector<float> pixels(static_cast<size_t>(300 * config_.patch_dim()));
  std::vector<float> out(300 * 32);
  const std::vector<std::array<int64_t, 3>> g = {{1, 4, 6}};
  EXPECT_EQ(
      test::error_of([&] {
        encoder_->encode(g, ConstRows{pixels.data(), 20, 96, 96}, Rows{out.data(), 6, 32, 32});
      }),
      "vision encoder: pixel_values is [20, 96], the grids need [24, 96]");
  const std::vector<std::array<int64_t, 3>> odd = {{1, 3, 6}};
  EXPECT_NE(
      test::error_of([&] {
        encoder_->encode(odd, ConstRows{pixels.data(), 18, 96, 96}, Rows{out.data(), 4, 32, 32});
      }).find("grid 0 = [1, 3, 6]"),
      std::string::npos);
  const std::vector<std::array<int64_t, 3>> big = {{1, 16, 18}};
  EXPECT_EQ(
      test::error_of([&] {
        encoder_->encode(big, ConstRows{pixels.data(), 288, 96, 96}, Rows{out.data(), 72, 32, 32});
      }),
      "vision encoder: 288 patches exceed the encoder's max_patches 256");
}

INSTANTIATE_TEST_SUITE_P(Towers, VisionTowerTest,
                         ::testing::Values("qwen2_vl_f32", "qwen2_5_vl_f32", "qwen3_vl_f32",
                                           "qwen3_5_vl_f32", "qwen3_vl_moe_f32"));

// Qwen3-VL's learned positions (get_vision_interpolation_indices_and_weights, bilinear,
// align_corners): a 4 x 4 table onto a 2 x 4 grid. Row 1 is patch (h 0, w 1): src_h 0 (taps
// 0, 1 with weights 1, 0), src_w 1 (w tap 1 exactly: weights 1, 0 onto columns 1, 2).
TEST(VisionPassLayout, LearnedPositionsInterpolateBilinearly) {
  const std::vector<std::array<int64_t, 3>> g = {{1, 2, 4}};
  const VisionPassLayout p = vision_pass_layout(g, 2, 0, 4);
  ASSERT_EQ(p.pos_taps.size(), 32u);
  EXPECT_EQ(std::vector<int32_t>(p.pos_taps.begin() + 4, p.pos_taps.begin() + 8),
            (std::vector<int32_t>{1, 2, 5, 6}));
  EXPECT_EQ(std::vector<float>(p.pos_weights.begin() + 4, p.pos_weights.begin() + 8),
            (std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f}));
  // Row 2 is (h 1, w 0): src_h = 1 * 3 / 1 = 3, the last table row (taps clamped to 3).
  EXPECT_EQ(std::vector<int32_t>(p.pos_taps.begin() + 8, p.pos_taps.begin() + 12),
            (std::vector<int32_t>{12, 13, 12, 13}));
  // Row 4 is (h 0, w 2): src_w = 2 * 3 / 3 = 2.
  EXPECT_EQ(p.pos_taps[16], 2);
  for (size_t r = 0; r < 8; ++r) {
    float sum = 0;
    for (size_t k = 0; k < 4; ++k) sum += p.pos_weights[r * 4 + k];
    EXPECT_EQ(sum, 1.0f) << r;
  }
}

// Qwen2.5-VL's windows (get_vision_window_index): a 2 x 3 merged grid in 2 x 2 windows is one
// full window and one of 2 merged patches; the padded windows below are empty and dropped.
TEST(VisionPassLayout, WindowsReorderTheMergedPatches) {
  const std::vector<std::array<int64_t, 3>> g = {{1, 4, 6}};
  const VisionPassLayout p = vision_pass_layout(g, 2, 2);
  EXPECT_EQ(p.cu_window_seqlens, (std::vector<int32_t>{0, 16, 24}));
  EXPECT_EQ(p.merged_inverse, (std::vector<int32_t>{0, 1, 4, 2, 3, 5}));
  // Row 8 (window order) is merged patch 3's first row: patch row 12, at (h, w) = (2, 0).
  EXPECT_EQ(p.window_rows[8], 12);
  EXPECT_EQ(std::vector<int32_t>(p.positions3.begin() + 24, p.positions3.begin() + 27),
            (std::vector<int32_t>{0, 2, 0}));
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 24}));
}

TEST(VisionPassLayout, PositionsFollowTheMergeBlocksAndSegmentsTheFrames) {
  const std::vector<std::array<int64_t, 3>> g = {{1, 2, 4}, {2, 2, 2}};
  const VisionPassLayout p = vision_pass_layout(g, 2);
  EXPECT_EQ(p.n_rows, 16);
  EXPECT_EQ(p.n_merged, 4);
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 8, 12, 16}));
  // Image 0: blocks (0, 0) then (0, 1), each (h, w) in-block order.
  const std::vector<int32_t> first = {0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1,
                                      0, 0, 2, 0, 0, 3, 0, 1, 2, 0, 1, 3};
  EXPECT_EQ(std::vector<int32_t>(p.positions3.begin(), p.positions3.begin() + 24), first);
}

}  // namespace
}  // namespace metrale
