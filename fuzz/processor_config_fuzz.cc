// libFuzzer target for preprocessor_config.json / video_preprocessor_config.json: any bytes
// must give a config or a metrale::Error. A config that parses must then drive the geometry
// it configures without crashing: the resize target of a few image sizes (and the full
// preprocess of a tiny image when that target is small), frame sampling for a few clip
// lengths (indices in range), and the tokenizer_config.json parser, which reads
// the same kind of small JSON file.
//
// Seeds: tests/data/vision/reference/configs/*.json, e.g.
//   ./processor_config_fuzz -dict=fuzz/processor_config.dict tests/data/vision/reference/configs
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/json/json_parse.h"
#include "io/tokenizer/tokenizer_config.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/video_sampling.h"

namespace {

using namespace metrale::vision;

// Keeps the fuzzer exploring parsing rather than allocating huge resize buffers.
constexpr int64_t kMaxFuzzPixels = int64_t{1} << 20;

Image tiny_image(int width, int height) {
  Image image;
  image.width = width;
  image.height = height;
  image.rgb.resize(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < image.rgb.size(); ++i) image.rgb[i] = static_cast<uint8_t>(i * 37);
  return image;
}

void exercise_image(const ImageProcessorConfig& config) {
  static const Image kImage = tiny_image(13, 7);
  for (const auto& [h, w] :
       {std::pair{7, 13}, std::pair{1, 1}, std::pair{4000, 3}, std::pair{28, 28}}) {
    try {
      const ResizeTarget t = image_target_size(config, h, w);
      if (t.height <= 0 || t.width <= 0) std::abort();
      if (h == kImage.height && w == kImage.width &&
          int64_t{t.height} * t.width <= kMaxFuzzPixels) {
        (void)preprocess_image(kImage, config);
      }
    } catch (const metrale::Error&) {
    }
  }
}

void exercise_video(const VideoProcessorConfig& config) {
  for (const int64_t total : {int64_t{1}, int64_t{7}, int64_t{301}}) {
    for (const double fps : {1.0, 29.97}) {
      try {
        const std::vector<int64_t> idx = sample_frame_indices(config, total, fps);
        for (size_t i = 0; i < idx.size(); ++i) {
          if (idx[i] < 0 || idx[i] >= total) std::abort();
        }
        if (!idx.empty() && config.geometry.temporal_patch_size > 0) {
          (void)temporal_patch_timestamps(config.family, idx, fps,
                                          config.geometry.temporal_patch_size);
        }
      } catch (const metrale::Error&) {
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)metrale::parse_tokenizer_config(text, "fuzz/tokenizer_config.json");
  } catch (const metrale::Error&) {
  }
  nlohmann::json j;
  try {
    j = metrale::parse_json(text, "fuzz/preprocessor_config.json");
  } catch (const metrale::Error&) {
    return 0;
  }
  try {
    exercise_image(parse_image_processor_config(j, "fuzz/preprocessor_config.json"));
  } catch (const metrale::Error&) {
  }
  try {
    exercise_video(parse_video_processor_config(j, "fuzz/video_preprocessor_config.json"));
  } catch (const metrale::Error&) {
  }
  return 0;
}
