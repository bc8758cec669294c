// M-RoPE positions equal transformers' get_rope_index (tests/data/vision/mrope/positions.json,
// from tools/fixtures/vision/make_mrope_positions.py) for every family and layout; bad
// layouts are refused naming the run or grid.
#include "vision/mrope_positions.h"

#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace metrale::vision {
namespace {

using nlohmann::json;

json load_cases() {
  std::ifstream f("tests/data/vision/mrope/positions.json");
  EXPECT_TRUE(f.good());
  return json::parse(f)["cases"];
}

std::vector<std::array<int64_t, 3>> grids(const json& j) {
  std::vector<std::array<int64_t, 3>> out;
  for (const json& g : j)
    out.push_back({g[0].get<int64_t>(), g[1].get<int64_t>(), g[2].get<int64_t>()});
  return out;
}

TEST(MropePositions, EqualTransformersGetRopeIndex) {
  const json cases = load_cases();
  ASSERT_EQ(cases.size(), 40u);
  for (const json& c : cases) {
    SCOPED_TRACE(c["family"].get<std::string>() + " " + c["name"].get<std::string>());
    std::vector<int32_t> types;
    for (const json& run : c["token_type_runs"])
      types.insert(types.end(), run[1].get<size_t>(), run[0].get<int32_t>());
    const auto images = grids(c["image_grid_thw"]);
    const auto videos = grids(c["video_grid_thw"]);
    std::vector<float> seconds;
    if (c.contains("second_per_grid_ts"))
      seconds = c["second_per_grid_ts"].get<std::vector<float>>();
    const MropePositions got =
        mrope_positions(mrope_index_style(c["family"].get<std::string>()),
                        {.token_types = types,
                         .image_grids = images,
                         .video_grids = videos,
                         .second_per_grid_ts = seconds,
                         .spatial_merge_size = c["spatial_merge_size"].get<int64_t>(),
                         .tokens_per_second = c.value("tokens_per_second", int64_t{1})});
    const json& want = c["positions"];
    ASSERT_EQ(got.positions3.size(), types.size() * 3);
    for (size_t i = 0; i < types.size(); ++i) {
      for (size_t a = 0; a < 3; ++a)
        ASSERT_EQ(got.positions3[i * 3 + a], want[a][i].get<int32_t>())
            << "token " << i << " axis " << a;
    }
    EXPECT_EQ(got.rope_delta, c["rope_delta"].get<int64_t>());
  }
}

TEST(MropePositions, TokenTypesAndStyles) {
  const std::vector<int32_t> ids = {5, 151655, 151655, 7, 151656, 9};
  EXPECT_EQ(mm_token_types(ids, 151655, 151656), (std::vector<int32_t>{0, 1, 1, 0, 2, 0}));
  // GLM-4V: image tokens inside <|begin_of_video|> (248) ... <|end_of_video|> (249) are a
  // video's frames (Glm4vProcessor.create_mm_token_type_ids).
  const std::vector<int32_t> glm = {250, 248, 252, 250, 250, 253, 9, 252, 250, 253, 249, 250};
  EXPECT_EQ(mm_token_types(glm, 250, 251, 248, 249),
            (std::vector<int32_t>{1, 0, 0, 2, 2, 0, 0, 0, 2, 0, 0, 1}));
  EXPECT_EQ(mrope_index_style("qwen3_5_moe"), MropeIndexStyle::kQwen3Vl);
  EXPECT_EQ(mrope_index_style("glm4v"), MropeIndexStyle::kQwen3Vl);  // images as Qwen2-VL's
  EXPECT_EQ(mrope_index_style("qwen2_5_vl"), MropeIndexStyle::kQwen2_5Vl);
  EXPECT_NE(test::error_of([] { mrope_index_style("llama"); }).find("\"llama\" has no multimodal"),
            std::string::npos);
  // Text alone: 0..n-1 on every axis, delta 0.
  const std::vector<int32_t> text(4, 0);
  const MropePositions p = mrope_positions(MropeIndexStyle::kQwen2Vl, {.token_types = text});
  EXPECT_EQ(p.positions3, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}));
  EXPECT_EQ(p.rope_delta, 0);
}

TEST(MropePositions, BadLayoutsAreRefused) {
  const std::vector<std::array<int64_t, 3>> one = {{1, 4, 4}};
  const std::vector<int32_t> four = {0, 1, 1, 1, 1, 0};
  auto run = [&](MropeIndexStyle s, std::span<const int32_t> types,
                 std::span<const std::array<int64_t, 3>> images,
                 std::span<const std::array<int64_t, 3>> videos = {}) {
    return test::error_of([&] {
      mrope_positions(s, {.token_types = types, .image_grids = images, .video_grids = videos});
    });
  };
  const std::vector<int32_t> three = {0, 1, 1, 1, 0};
  EXPECT_EQ(run(MropeIndexStyle::kQwen2Vl, three, one),
            "mrope positions: the image run at token 1 holds 3 tokens; its grid [1, 4, 4] (image "
            "grid 0) merges to 4");
  EXPECT_EQ(run(MropeIndexStyle::kQwen2Vl, four, {}),
            "mrope positions: the image tokens at 1 have no grid left (0 image grids given)");
  const std::vector<std::array<int64_t, 3>> two = {{1, 4, 4}, {1, 2, 2}};
  EXPECT_EQ(run(MropeIndexStyle::kQwen2Vl, four, two),
            "mrope positions: 2 image grids given, the prompt's image tokens use 1");
  const std::vector<std::array<int64_t, 3>> odd = {{1, 3, 4}};
  EXPECT_NE(run(MropeIndexStyle::kQwen2Vl, four, odd).find("image_grid_thw[0] = [1, 3, 4]"),
            std::string::npos);
  const std::vector<int32_t> bad = {0, 3, 0};
  EXPECT_EQ(run(MropeIndexStyle::kQwen2Vl, bad, {}),
            "mrope positions: token 1 has type 3; expected 0 (text), 1 (image) or 2 (video)");
  // Qwen3-VL splits a video per frame: one run of both frames' tokens is one frame too long.
  const std::vector<int32_t> video2 = {0, 2, 2, 0};
  const std::vector<std::array<int64_t, 3>> v = {{2, 2, 2}};
  EXPECT_EQ(run(MropeIndexStyle::kQwen3Vl, video2, {}, v),
            "mrope positions: the video run at token 1 holds 2 tokens; its grid [1, 2, 2] (video "
            "grid 0) merges to 1");
  // Qwen2-VL keeps the video whole: the same run is its two frames.
  EXPECT_NO_THROW(
      mrope_positions(MropeIndexStyle::kQwen2Vl, {.token_types = video2, .video_grids = v}));
}

}  // namespace
}  // namespace metrale::vision
