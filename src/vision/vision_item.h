#pragma once
// VisionItem: one preprocessed image or video, the unit handed to a vision-language model.
// `pixels` is exactly the processor's pixel_values (pixel_values_videos) for this item:
// f32 [n_patches, C * T * ps * ps], rows in the processor's merge-block order
// (t, h-block, w-block, h-in-block, w-in-block), each row laid out (C, T, ps, ps).
#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace metrale::vision {

enum class VisionKind { kImage, kVideo };

struct VisionItem {
  VisionKind kind = VisionKind::kImage;
  std::array<int64_t, 3>
      grid_thw{};         // [grid_t, grid_h, grid_w] in patches: image_grid_thw / video_grid_thw
  int64_t patch_dim = 0;  // C * temporal_patch_size * patch_size^2
  int merge_size = 2;
  int resized_height = 0;  // pixels after smart_resize
  int resized_width = 0;
  std::vector<float> pixels;  // [n_patches(), patch_dim]

  // Video only: the source frames used (before padding to a multiple of the temporal patch
  // size) and seconds per temporal patch (see video_sampling.h for each family's rule), and
  // the source's frame rate and frame count (HF's VideoMetadata fps / total_num_frames): what
  // Qwen2.5-VL's second_per_grid_ts and Qwen3-VL's prompt timestamps are computed from.
  std::vector<int64_t> frame_indices;
  std::vector<double> timestamps;
  double fps = 0;            // 0: unknown (transformers then assumes 24)
  int64_t total_frames = 0;  // 0: unknown

  int64_t n_patches() const { return grid_thw[0] * grid_thw[1] * grid_thw[2]; }
  // Placeholder tokens in the prompt: merge_size x merge_size patches become one token.
  int64_t n_tokens() const { return n_patches() / (int64_t{merge_size} * merge_size); }
  // Tokens per temporal patch (one frame group); videos repeat this many per grid_t.
  int64_t tokens_per_frame() const {
    return grid_thw[1] * grid_thw[2] / (int64_t{merge_size} * merge_size);
  }

  TensorView view() {
    return TensorView::contiguous(pixels.data(), DType::kF32, Shape{n_patches(), patch_dim});
  }
};

}  // namespace metrale::vision
