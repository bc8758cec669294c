#pragma once
// What a checkpoint's preprocessor_config.json / video_preprocessor_config.json says about
// geometry and normalisation, parsed strictly: an unknown processor type, a field of the wrong
// type or range, or a size dict without the keys the processor needs is an Error naming the
// file and field. Fields a file omits take the processor class's default in transformers 5.24
// (the values below), exactly as the HF classes do.
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "vision/resize.h"

namespace metrale::vision {

// Which geometry rules apply. The image family decides smart_resize; the video family also
// decides frame sampling and timestamps.
enum class ImageFamily {
  kQwen2Vl,  // Qwen2VLImageProcessor: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 checkpoints
  kGlm4v,    // Glm4vImageProcessor: GLM-4.1V / GLM-4.5V
};
enum class VideoFamily {
  kQwen2Vl,  // Qwen2VLVideoProcessor (Qwen2-VL, Qwen2.5-VL)
  kQwen3Vl,  // Qwen3VLVideoProcessor (Qwen3-VL, Qwen3.5)
  kGlm4v,    // Glm4vVideoProcessor
};

// Fields shared by image and video processors.
struct PatchGeometry {
  int patch_size = 14;
  int temporal_patch_size = 2;
  int merge_size = 2;
  int64_t min_pixels = 0;  // size.shortest_edge (or min_pixels)
  int64_t max_pixels = 0;  // size.longest_edge (or max_pixels)
  bool do_resize = true;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<float, 3> image_mean{};
  std::array<float, 3> image_std{};
  // Which resampler reproduces this processor: the torchvision backend is transformers'
  // default whenever torchvision is installed; a "*Pil" processor type selects PIL.
  ResizeKernel resize_kernel = ResizeKernel::kTorchvision;

  int factor() const { return patch_size * merge_size; }
};

struct ImageProcessorConfig {
  ImageFamily family = ImageFamily::kQwen2Vl;
  std::string type_name;  // as written in the file, e.g. "Qwen2VLImageProcessorFast"
  PatchGeometry geometry;
};

struct VideoProcessorConfig {
  VideoFamily family = VideoFamily::kQwen2Vl;
  std::string type_name;
  PatchGeometry geometry;
  bool do_sample_frames = false;
  std::optional<double> fps;      // target sampling rate
  std::optional<int> num_frames;  // fixed frame count (exclusive with fps)
  int min_frames = 4;
  int max_frames = 768;
  double max_duration = 300;  // GLM-4V: longer videos are spread over max_duration * fps
};

const char* image_family_name(ImageFamily family);
const char* video_family_name(VideoFamily family);

// `source` names the file in error messages.
ImageProcessorConfig parse_image_processor_config(const nlohmann::json& j, std::string_view source);
VideoProcessorConfig parse_video_processor_config(const nlohmann::json& j, std::string_view source);

// Reads a model directory: preprocessor_config.json for images; video_preprocessor_config.json
// for videos, falling back to preprocessor_config.json as AutoVideoProcessor does (the video
// type is then inferred from the image type).
ImageProcessorConfig load_image_processor_config(const std::filesystem::path& model_dir);
VideoProcessorConfig load_video_processor_config(const std::filesystem::path& model_dir);

}  // namespace metrale::vision
