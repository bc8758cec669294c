// `metrale preprocess --model DIR FILE...`: runs the checkpoint's image/video processor on
// each file and prints the grid and placeholder-token count; --out writes pixel_values /
// image_grid_thw (and the video tensors) to a .safetensors file, named as the HF processors
// name them.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "io/safetensors/writer.h"
#include "vision/decode.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/video.h"

namespace metrale::cli {
namespace {

struct PreprocessArgs {
  std::string model;
  std::vector<std::string> files;
  std::string out;
  std::string resize;  // "", "torchvision" or "pil"
  bool video = false;
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  METRALE_CHECK(in.good(), path, ": cannot open file");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool looks_like_video(const std::string& path, std::span<const uint8_t> bytes) {
  for (const char* ext :
       {".mp4", ".webm", ".mkv", ".mov", ".avi", ".m4v", ".mpg", ".mpeg", ".ts"}) {
    const std::string e(ext);
    if (path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0)
      return true;
  }
  return vision::sniff_format(bytes) == vision::ImageFormat::kUnknown;
}

void append(std::vector<float>& dst, const std::vector<float>& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

std::span<const std::byte> bytes_of(const auto& v) { return std::as_bytes(std::span(v)); }

void run(const PreprocessArgs& a) {
  vision::ImageProcessorConfig image_config = vision::load_image_processor_config(a.model);
  if (a.resize == "pil") image_config.geometry.resize_kernel = vision::ResizeKernel::kPil;
  if (a.resize == "torchvision")
    image_config.geometry.resize_kernel = vision::ResizeKernel::kTorchvision;
  std::vector<float> image_pixels, video_pixels;
  std::vector<int64_t> image_grids, video_grids;
  int64_t image_dim = 0, video_dim = 0;
  for (const std::string& path : a.files) {
    with_context(path, [&] {
      const std::vector<uint8_t> bytes = read_file(path);
      const bool video = a.video || looks_like_video(path, bytes);
      if (!video) {
        const vision::Image img = vision::decode_image(bytes);
        const vision::VisionItem item = vision::preprocess_image(img, image_config);
        std::printf(
            "%s: image %dx%d -> %dx%d (%s), grid_thw [%lld, %lld, %lld], %lld patches x %lld, %lld "
            "tokens\n",
            path.c_str(), img.width, img.height, item.resized_width, item.resized_height,
            vision::resize_kernel_name(image_config.geometry.resize_kernel),
            static_cast<long long>(item.grid_thw[0]), static_cast<long long>(item.grid_thw[1]),
            static_cast<long long>(item.grid_thw[2]), static_cast<long long>(item.n_patches()),
            static_cast<long long>(item.patch_dim), static_cast<long long>(item.n_tokens()));
        append(image_pixels, item.pixels);
        image_grids.insert(image_grids.end(), item.grid_thw.begin(), item.grid_thw.end());
        image_dim = item.patch_dim;
        return;
      }
      const vision::VideoProcessorConfig video_config =
          vision::load_video_processor_config(a.model);
      const vision::VideoFrames frames = vision::decode_video_file(path);
      METRALE_CHECK(!frames.frames.empty(), "the video decoded to no frames");
      const double fps =
          frames.fps > 0 ? frames.fps : 24.0;  // HF's default when the rate is unknown
      const vision::VisionItem item = vision::preprocess_video(frames.frames, fps, video_config);
      std::printf(
          "%s: video %zu frames @ %.3f fps %dx%d -> %zu sampled, %dx%d, grid_thw [%lld, %lld, "
          "%lld], "
          "%lld tokens (%lld per frame group)\n",
          path.c_str(), frames.frames.size(), fps, frames.frames[0].width, frames.frames[0].height,
          item.frame_indices.size(), item.resized_width, item.resized_height,
          static_cast<long long>(item.grid_thw[0]), static_cast<long long>(item.grid_thw[1]),
          static_cast<long long>(item.grid_thw[2]), static_cast<long long>(item.n_tokens()),
          static_cast<long long>(item.tokens_per_frame()));
      append(video_pixels, item.pixels);
      video_grids.insert(video_grids.end(), item.grid_thw.begin(), item.grid_thw.end());
      video_dim = item.patch_dim;
    });
  }
  if (a.out.empty()) return;
  SafetensorsWriter w;
  if (!image_grids.empty()) {
    w.add("pixel_values", DType::kF32,
          Shape{static_cast<int64_t>(image_pixels.size()) / image_dim, image_dim},
          bytes_of(image_pixels));
    w.add("image_grid_thw", DType::kI64, Shape{static_cast<int64_t>(image_grids.size() / 3), 3},
          bytes_of(image_grids));
  }
  if (!video_grids.empty()) {
    w.add("pixel_values_videos", DType::kF32,
          Shape{static_cast<int64_t>(video_pixels.size()) / video_dim, video_dim},
          bytes_of(video_pixels));
    w.add("video_grid_thw", DType::kI64, Shape{static_cast<int64_t>(video_grids.size() / 3), 3},
          bytes_of(video_grids));
  }
  w.write(a.out);
  std::printf("wrote %s\n", a.out.c_str());
}

void setup(CLI::App& app) {
  auto args = std::make_shared<PreprocessArgs>();
  CLI::App* cmd = app.add_subcommand(
      "preprocess", "Run a checkpoint's image/video processor; print grids and tokens");
  cmd->add_option("--model", args->model, "Checkpoint directory (preprocessor_config.json)")
      ->required();
  cmd->add_option("files", args->files, "Image or video files")->required();
  cmd->add_option("--out", args->out, "Write the tensors to this .safetensors file");
  cmd->add_option("--resize", args->resize,
                  "Override the image resizer (torchvision = HF default, or pil)")
      ->check(CLI::IsMember({"torchvision", "pil"}));
  cmd->add_flag("--video", args->video, "Treat every file as a video");
  cmd->callback([args] { run(*args); });
}

METRALE_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace metrale::cli
