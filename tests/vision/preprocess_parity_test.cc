// Parity with transformers 5.24's processors: every case in
// tests/data/vision/reference/reference.json (made by tools/fixtures/vision/make_reference.py)
// is rerun here. pixel_values must match bit for bit: the checksum covers every float32, and
// head/tail values give a readable diff when it does not.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/smart_resize.h"
#include "vision/video_sampling.h"

namespace metrale::vision {
namespace {

using nlohmann::json;

const std::string kRefDir = "tests/data/vision/reference/";

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

const json& reference() {
  static const json j = read_json(kRefDir + "reference.json");
  return j;
}

// Same pattern as make_reference.py's pattern().
Image pattern(int w, int h, int64_t seed) {
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      for (int64_t c = 0; c < 3; ++c) {
        const int64_t v = (x * x * 3 + y * 7 + c * 85 + seed * 31) ^ (y * y * 5 + x * 11 + seed);
        img.rgb[static_cast<size_t>((y * w + x) * 3 + c)] = static_cast<uint8_t>(v & 255);
      }
    }
  }
  return img;
}

Image load_input(const json& desc) {
  const int w = desc["width"].get<int>();
  const int h = desc["height"].get<int>();
  if (desc["kind"] == "pattern") return pattern(w, h, desc["seed"].get<int64_t>());
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  std::ifstream in(desc["path"].get<std::string>(), std::ios::binary);
  EXPECT_TRUE(in.good()) << desc["path"];
  in.read(reinterpret_cast<char*>(img.rgb.data()), static_cast<std::streamsize>(img.rgb.size()));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(img.rgb.size()));
  return img;
}

// make_reference.py's checksum(): position-keyed sum of mixed float32 bit patterns.
std::string checksum(const std::vector<float>& v) {
  uint64_t total = 0;
  const uint64_t k1 = 0x9E3779B97F4A7C15ull * 2;
  const uint64_t k2 = 0xD6E8FEB86659FD93ull;
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    const uint64_t m = (uint64_t{bits} + 1) * (static_cast<uint64_t>(i) * k1 + k2);
    total += m ^ (m >> 29);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(total));
  return buf;
}

void expect_matches(const VisionItem& item, const json& c, const std::string& label) {
  ASSERT_EQ(item.grid_thw[0], c["grid_thw"][0].get<int64_t>()) << label;
  ASSERT_EQ(item.grid_thw[1], c["grid_thw"][1].get<int64_t>()) << label;
  ASSERT_EQ(item.grid_thw[2], c["grid_thw"][2].get<int64_t>()) << label;
  ASSERT_EQ(item.n_patches(), c["shape"][0].get<int64_t>()) << label;
  ASSERT_EQ(item.patch_dim, c["shape"][1].get<int64_t>()) << label;
  ASSERT_EQ(item.pixels.size(), static_cast<size_t>(item.n_patches() * item.patch_dim)) << label;
  const auto& head = c["head"];
  const auto& tail = c["tail"];
  for (size_t i = 0; i < head.size(); ++i) {
    EXPECT_EQ(item.pixels[i], head[i].get<float>()) << label << " head[" << i << "]";
    EXPECT_EQ(item.pixels[item.pixels.size() - tail.size() + i], tail[i].get<float>())
        << label << " tail[" << i << "]";
  }
  EXPECT_EQ(checksum(item.pixels), c["checksum"].get<std::string>())
      << label << ": some pixel value differs";
}

TEST(PreprocessParity, ImagesMatchTransformers) {
  int checked = 0, refused = 0;
  for (const json& c : reference()["image_cases"]) {
    const std::string name = c["config"].get<std::string>();
    const std::string label = name + " " + c["input"].dump();
    const ImageProcessorConfig config =
        parse_image_processor_config(read_json(kRefDir + "configs/" + name + ".json"), name);
    const Image img = load_input(c["input"]);
    if (c.contains("error")) {
      EXPECT_THROW(preprocess_image(img, config), Error) << label;
      ++refused;
      continue;
    }
    SCOPED_TRACE(label);
    const VisionItem item = preprocess_image(img, config);
    EXPECT_EQ(item.kind, VisionKind::kImage);
    EXPECT_EQ(item.n_tokens(), item.n_patches() / 4);
    expect_matches(item, c, label);
    ++checked;
  }
  EXPECT_GE(checked, 70);
  EXPECT_GE(refused, 1);
}

TEST(PreprocessParity, VideosMatchTransformers) {
  int checked = 0;
  for (const json& c : reference()["video_cases"]) {
    const std::string name = c["config"].get<std::string>();
    const std::string label = name + " " + c["input"].dump();
    const VideoProcessorConfig config =
        parse_video_processor_config(read_json(kRefDir + "configs/" + name + ".json"), name);
    const json& in = c["input"];
    std::vector<Image> frames;
    for (int i = 0; i < in["frames"].get<int>(); ++i) {
      frames.push_back(
          pattern(in["width"].get<int>(), in["height"].get<int>(), in["seed0"].get<int>() + i));
    }
    const double fps = in["fps"].get<double>();
    if (c.contains("error")) {
      EXPECT_THROW(preprocess_video(frames, fps, config), Error) << label;
      continue;
    }
    SCOPED_TRACE(label);
    const VisionItem item = preprocess_video(frames, fps, config);
    EXPECT_EQ(item.kind, VisionKind::kVideo);
    EXPECT_EQ(item.frame_indices, c["frame_indices"].get<std::vector<int64_t>>()) << label;
    EXPECT_EQ(item.timestamps.size(), static_cast<size_t>(item.grid_thw[0])) << label;
    expect_matches(item, c, label);
    ++checked;
  }
  EXPECT_EQ(checked, 16);
}

TEST(PreprocessParity, FrameSamplingMatchesTransformers) {
  int checked = 0;
  for (const json& s : reference()["sampling"]) {
    const std::string name = s["config"].get<std::string>();
    const VideoProcessorConfig config =
        parse_video_processor_config(read_json(kRefDir + "configs/" + name + ".json"), name);
    const int64_t total = s["total"].get<int64_t>();
    const double fps = s["fps"].get<double>();
    const std::string label =
        name + " total=" + std::to_string(total) + " fps=" + std::to_string(fps);
    if (s.contains("error")) {
      EXPECT_THROW(sample_frame_indices(config, total, fps), Error) << label;
    } else {
      EXPECT_EQ(sample_frame_indices(config, total, fps), s["indices"].get<std::vector<int64_t>>())
          << label;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 336);
}

TEST(PreprocessParity, SmartResizeMatchesTransformers) {
  int checked = 0;
  for (const json& r : reference()["smart_resize"]) {
    const int64_t factor = r[0], lo = r[1], hi = r[2], h = r[3], w = r[4];
    const std::string label = "factor=" + std::to_string(factor) + " [" + std::to_string(lo) + "," +
                              std::to_string(hi) + "] " + std::to_string(w) + "x" +
                              std::to_string(h);
    auto check = [&](const json& expected, auto&& fn, const char* which) {
      if (expected.is_null()) {
        EXPECT_THROW(fn(), Error) << which << " " << label;
      } else {
        const ResizeTarget t = fn();
        EXPECT_EQ(t.height, expected[0].get<int>()) << which << " " << label;
        EXPECT_EQ(t.width, expected[1].get<int>()) << which << " " << label;
      }
    };
    check(
        r[5], [&] { return qwen_smart_resize(h, w, factor, lo, hi); }, "qwen");
    check(
        r[6], [&] { return temporal_smart_resize(2, h, w, 2, factor, lo, hi); }, "glm t=2");
    check(
        r[7], [&] { return temporal_smart_resize(9, h, w, 2, factor, lo, hi); }, "glm t=9");
    ++checked;
  }
  EXPECT_GT(checked, 1900);
}

}  // namespace
}  // namespace metrale::vision
