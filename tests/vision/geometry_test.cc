// Geometry building blocks and bad input: resize invariants, smart_resize and config errors.
// (Bit-exact parity with transformers is in preprocess_parity_test.cc.)
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/test_support.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/resize.h"
#include "vision/smart_resize.h"
#include "vision/video_sampling.h"

namespace metrale::vision {
namespace {

using nlohmann::json;

Image solid(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  Image img;
  img.width = w;
  img.height = h;
  for (int i = 0; i < w * h; ++i) img.rgb.insert(img.rgb.end(), {r, g, b});
  return img;
}

class ResizeKernels : public ::testing::TestWithParam<ResizeKernel> {};

TEST_P(ResizeKernels, ConstantImageStaysConstant) {
  // Normalised weights sum to 1 in fixed point up to rounding, so a flat colour survives.
  for (auto [w, h, ow, oh] :
       {std::array{37, 23, 11, 50}, {5, 90, 64, 3}, {1, 1, 28, 56}, {300, 200, 28, 28}}) {
    const Image out = resize_bicubic(solid(w, h, 200, 17, 255), ow, oh, GetParam());
    ASSERT_EQ(out.width, ow);
    ASSERT_EQ(out.height, oh);
    for (int i = 0; i < ow * oh; ++i) {
      EXPECT_EQ(out.rgb[static_cast<size_t>(i) * 3 + 0], 200);
      EXPECT_EQ(out.rgb[static_cast<size_t>(i) * 3 + 1], 17);
      EXPECT_EQ(out.rgb[static_cast<size_t>(i) * 3 + 2], 255);
    }
  }
}

TEST_P(ResizeKernels, SameSizeIsACopyAndBadSizesThrow) {
  Image img = solid(4, 3, 1, 2, 3);
  img.rgb[5] = 99;
  EXPECT_EQ(resize_bicubic(img, 4, 3, GetParam()).rgb, img.rgb);
  EXPECT_THROW(resize_bicubic(img, 0, 3, GetParam()), Error);
  EXPECT_THROW(resize_bicubic(img, 4, -1, GetParam()), Error);
  EXPECT_THROW(resize_bicubic(Image{}, 4, 4, GetParam()), Error);
  Image truncated = img;
  truncated.rgb.pop_back();
  EXPECT_THROW(resize_bicubic(truncated, 8, 8, GetParam()), Error);
}

INSTANTIATE_TEST_SUITE_P(Both, ResizeKernels,
                         ::testing::Values(ResizeKernel::kTorchvision, ResizeKernel::kPil));

TEST(SmartResize, RoundsHalfToEvenLikePython) {
  // 42 / 28 = 1.5 -> 2, 70 / 28 = 2.5 -> 2 (Python's round), both within limits.
  const ResizeTarget t = qwen_smart_resize(70, 42, 28, 28 * 28, 28 * 28 * 100);
  EXPECT_EQ(t.height, 56);
  EXPECT_EQ(t.width, 56);
}

TEST(SmartResize, RefusesBadInput) {
  EXPECT_THROW(qwen_smart_resize(0, 10, 28, 3136, 100000), Error);
  EXPECT_THROW(qwen_smart_resize(10, -1, 28, 3136, 100000), Error);
  EXPECT_THROW(qwen_smart_resize(10, 3000, 28, 3136, 100000), Error);          // aspect ratio 300
  EXPECT_THROW(qwen_smart_resize(100, 100, 0, 3136, 100000), Error);           // factor
  EXPECT_THROW(qwen_smart_resize(100, 100, 28, 200000, 100000), Error);        // min > max
  EXPECT_THROW(qwen_smart_resize(1 << 25, 1 << 25, 28, 3136, 100000), Error);  // huge
  EXPECT_THROW(temporal_smart_resize(1, 100, 100, 2, 28, 3136, 100000),
               Error);                                            // t < temporal factor
  EXPECT_THROW(qwen_smart_resize(10, 10, 28, 0, 100000), Error);  // resizes to 0x0
}

TEST(ProcessorConfig, DefaultsAndOverrides) {
  const ImageProcessorConfig q =
      parse_image_processor_config(json{{"image_processor_type", "Qwen2VLImageProcessor"},
                                        {"min_pixels", 100},
                                        {"max_pixels", 5000}},
                                   "cfg");
  EXPECT_EQ(q.family, ImageFamily::kQwen2Vl);
  EXPECT_EQ(q.geometry.min_pixels, 100);
  EXPECT_EQ(q.geometry.max_pixels, 5000);
  EXPECT_EQ(q.geometry.patch_size, 14);
  EXPECT_EQ(q.geometry.resize_kernel, ResizeKernel::kTorchvision);
  const ImageProcessorConfig g =
      parse_image_processor_config(json{{"image_processor_type", "Glm4vImageProcessorPil"}}, "cfg");
  EXPECT_EQ(g.family, ImageFamily::kGlm4v);
  EXPECT_EQ(g.geometry.min_pixels, 112 * 112);
  EXPECT_EQ(g.geometry.resize_kernel, ResizeKernel::kPil);
  const VideoProcessorConfig v =
      parse_video_processor_config(json{{"image_processor_type", "Qwen2VLImageProcessorFast"},
                                        {"processor_class", "Qwen3VLProcessor"}},
                                   "cfg");
  EXPECT_EQ(v.family, VideoFamily::kQwen3Vl);
  EXPECT_EQ(v.geometry.patch_size, 16);
  EXPECT_TRUE(v.do_sample_frames);
  ASSERT_TRUE(v.fps.has_value());
  EXPECT_EQ(*v.fps, 2.0);
}

void expect_error_mentions(const json& j, const std::string& needle) {
  try {
    parse_image_processor_config(j, "preprocessor_config.json");
    ADD_FAILURE() << "no error for " << j.dump();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("preprocessor_config.json"), std::string::npos)
        << e.what();
  }
}

TEST(ProcessorConfig, BadFieldsAreNamed) {
  const std::string t = "Qwen2VLImageProcessor";
  expect_error_mentions(json{{"image_processor_type", "CLIPImageProcessor"}},
                        "image_processor_type");
  expect_error_mentions(json{{"patch_size", 14}}, "image_processor_type");
  expect_error_mentions(json{{"image_processor_type", t}, {"patch_size", "14"}}, "patch_size");
  expect_error_mentions(json{{"image_processor_type", t}, {"patch_size", 0}}, "patch_size");
  expect_error_mentions(json{{"image_processor_type", t}, {"image_mean", {0.5, 0.5}}},
                        "image_mean");
  expect_error_mentions(json{{"image_processor_type", t}, {"image_std", {0.5, 0.0, 0.5}}},
                        "image_std");
  expect_error_mentions(
      json{{"image_processor_type", t}, {"size", {{"min_pixels", 10}, {"max_pixels", 99}}}},
      "shortest_edge");
  expect_error_mentions(
      json{{"image_processor_type", t}, {"min_pixels", 5000}, {"max_pixels", 100}}, "exceed");
  expect_error_mentions(json{{"image_processor_type", t}, {"resample", 2}}, "resample");
  expect_error_mentions(json{{"image_processor_type", t}, {"do_resize", 1}}, "do_resize");
  expect_error_mentions(json::array(), "JSON object");
}

// A deeply nested field used to overflow the stack when its error message dumped it
// (fuzz/processor_config_fuzz); the file is now refused while parsing.
TEST(ProcessorConfig, DeepNestingInAFileIsAnErrorNotACrash) {
  const test::ScratchDir dir;
  std::ofstream(dir / "preprocessor_config.json")
      << "{\"image_processor_type\": " << std::string(100000, '[') << std::string(100000, ']')
      << "}";
  const std::string msg = test::error_of([&] { load_image_processor_config(dir.path()); });
  EXPECT_NE(msg.find("preprocessor_config.json: JSON nesting deeper than"), std::string::npos)
      << msg;
  std::ofstream(dir / "preprocessor_config.json") << "{\"image_processor_type\": ";
  EXPECT_NE(test::error_of([&] { load_image_processor_config(dir.path()); }).find("malformed JSON"),
            std::string::npos);
}

TEST(Preprocess, GridAndTokensForAQwenImage) {
  const ImageProcessorConfig c =
      parse_image_processor_config(json{{"image_processor_type", "Qwen2VLImageProcessor"}}, "c");
  const VisionItem item = preprocess_image(solid(200, 100, 10, 20, 30), c);
  // smart_resize(100, 200, 28) -> 112 x 196: grid 8 x 14 patches, 28 tokens.
  EXPECT_EQ(item.resized_height, 112);
  EXPECT_EQ(item.resized_width, 196);
  EXPECT_EQ(item.grid_thw, (std::array<int64_t, 3>{1, 8, 14}));
  EXPECT_EQ(item.patch_dim, 3 * 2 * 14 * 14);
  EXPECT_EQ(item.n_tokens(), 28);
  EXPECT_EQ(item.pixels.size(), static_cast<size_t>(112 * 1176));
  EXPECT_THROW(preprocess_image(Image{}, c), Error);
}

TEST(Preprocess, VideoFramesMustAgreeInSize) {
  const VideoProcessorConfig c =
      parse_video_processor_config(json{{"video_processor_type", "Qwen3VLVideoProcessor"}}, "c");
  std::vector<Image> frames = {solid(64, 64, 1, 2, 3), solid(64, 64, 1, 2, 3),
                               solid(32, 64, 1, 2, 3)};
  EXPECT_THROW(preprocess_video(frames, 2.0, c), Error);
  EXPECT_THROW(preprocess_video({}, 2.0, c), Error);
  frames.pop_back();
  EXPECT_THROW(preprocess_video(frames, 0.0, c), Error);  // sampling by fps needs a frame rate
  EXPECT_THROW(sample_frame_indices(c, 0, 30.0), Error);
}

TEST(VideoTimestamps, FamilyRules) {
  const std::vector<int64_t> idx = {0, 6, 12, 18, 24};
  EXPECT_EQ(temporal_patch_timestamps(VideoFamily::kQwen3Vl, idx, 12.0, 2),
            (std::vector<double>{0.25, 1.25, 2.0}));
  EXPECT_EQ(temporal_patch_timestamps(VideoFamily::kGlm4v, idx, 12.0, 2),
            (std::vector<double>{0.0, 1.0, 2.0}));
}

}  // namespace
}  // namespace metrale::vision
