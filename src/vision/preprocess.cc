#include "vision/preprocess.h"

#include <vector>

#include "core/error.h"
#include "vision/patchify.h"
#include "vision/resize.h"
#include "vision/video_sampling.h"

namespace metrale::vision {
namespace {

void check_image(const Image& image, const char* what) {
  METRALE_CHECK(image.width > 0 && image.height > 0, what, ": empty image (", image.width, "x",
                image.height, ")");
  METRALE_CHECK(image.rgb.size() == static_cast<size_t>(image.width) * image.height * 3, what,
                ": buffer holds ", image.rgb.size(), " bytes, expected ",
                static_cast<size_t>(image.width) * image.height * 3);
}

// Resizes (or not) to `target` and returns a frame the patchifier can read.
Image resized(const Image& in, ResizeTarget target, const PatchGeometry& g) {
  if (!g.do_resize) return in;
  return resize_bicubic(in, target.width, target.height, g.resize_kernel);
}

VisionItem make_item(VisionKind kind, const PatchGeometry& g, int grid_t, int height, int width) {
  VisionItem item;
  item.kind = kind;
  item.merge_size = g.merge_size;
  item.resized_height = height;
  item.resized_width = width;
  item.grid_thw = {grid_t, height / g.patch_size, width / g.patch_size};
  item.patch_dim = int64_t{3} * g.temporal_patch_size * g.patch_size * g.patch_size;
  item.pixels.resize(static_cast<size_t>(item.n_patches() * item.patch_dim));
  return item;
}

}  // namespace

ResizeTarget image_target_size(const ImageProcessorConfig& config, int height, int width) {
  const PatchGeometry& g = config.geometry;
  if (!g.do_resize) return {height, width};
  if (config.family == ImageFamily::kGlm4v) {
    return temporal_smart_resize(g.temporal_patch_size, height, width, g.temporal_patch_size,
                                 g.factor(), g.min_pixels, g.max_pixels);
  }
  return qwen_smart_resize(height, width, g.factor(), g.min_pixels, g.max_pixels);
}

VisionItem preprocess_image(const Image& image, const ImageProcessorConfig& config) {
  check_image(image, "preprocess image");
  const PatchGeometry& g = config.geometry;
  const ResizeTarget target = image_target_size(config, image.height, image.width);
  const Image frame = resized(image, target, g);
  VisionItem item = make_item(VisionKind::kImage, g, 1, frame.height, frame.width);
  // A still image is its own temporal patch, repeated temporal_patch_size times.
  const std::vector<const Image*> frames(static_cast<size_t>(g.temporal_patch_size), &frame);
  patchify(frames, g, make_normalize_table(g), item.pixels.data());
  return item;
}

VisionItem preprocess_video(std::span<const Image> frames, double fps,
                            const VideoProcessorConfig& config) {
  METRALE_CHECK(!frames.empty(), "preprocess video: no frames");
  for (const Image& f : frames) {
    check_image(f, "preprocess video frame");
    METRALE_CHECK(f.width == frames[0].width && f.height == frames[0].height,
                  "preprocess video: frame size ", f.width, "x", f.height,
                  " differs from the first frame's ", frames[0].width, "x", frames[0].height);
  }
  const PatchGeometry& g = config.geometry;
  const std::vector<int64_t> indices =
      sample_frame_indices(config, static_cast<int64_t>(frames.size()), fps);
  METRALE_CHECK(!indices.empty(), "preprocess video: frame sampling kept no frames");
  for (int64_t i : indices) {
    METRALE_CHECK(i >= 0 && i < static_cast<int64_t>(frames.size()),
                  "preprocess video: sampled frame ", i, " is outside the ", frames.size(),
                  " decoded frames");
  }
  const auto n = static_cast<int64_t>(indices.size());
  const int h = frames[0].height;
  const int w = frames[0].width;
  ResizeTarget target{h, w};
  if (g.do_resize) {
    target = config.family == VideoFamily::kQwen2Vl
                 ? qwen_smart_resize(h, w, g.factor(), g.min_pixels, g.max_pixels)
                 : temporal_smart_resize(n, h, w, g.temporal_patch_size, g.factor(), g.min_pixels,
                                         g.max_pixels);
  }
  // Resize each distinct source frame once (sampling may repeat indices).
  std::vector<Image> store;
  store.reserve(indices.size());
  std::vector<const Image*> seq;
  std::vector<int64_t> source_of_store;
  for (int64_t i : indices) {
    size_t k = 0;
    while (k < source_of_store.size() && source_of_store[k] != i) ++k;
    if (k == source_of_store.size()) {
      store.push_back(resized(frames[static_cast<size_t>(i)], target, g));
      source_of_store.push_back(i);
    }
    seq.push_back(nullptr);
  }
  for (size_t j = 0; j < indices.size(); ++j) {
    size_t k = 0;
    while (source_of_store[k] != indices[j]) ++k;
    seq[j] = &store[k];
  }
  while (seq.size() % static_cast<size_t>(g.temporal_patch_size) != 0) seq.push_back(seq.back());
  const int grid_t = static_cast<int>(seq.size()) / g.temporal_patch_size;
  VisionItem item = make_item(VisionKind::kVideo, g, grid_t, seq[0]->height, seq[0]->width);
  patchify(seq, g, make_normalize_table(g), item.pixels.data());
  item.frame_indices = indices;
  item.fps = fps;
  item.total_frames = static_cast<int64_t>(frames.size());
  item.timestamps = temporal_patch_timestamps(config.family, indices, fps, g.temporal_patch_size);
  return item;
}

}  // namespace metrale::vision
