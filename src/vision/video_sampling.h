#pragma once
// Frame sampling and per-temporal-patch timestamps, as each HF video processor's
// sample_frames (transformers 5.24) does it. Indices refer to the decoded frame list; the
// float arithmetic (torch.arange in float32, numpy linspace + round-half-even, Python int()
// truncation, math.ceil) is reproduced so the same frames are picked.
#include <cstdint>
#include <span>
#include <vector>

#include "vision/processor_config.h"

namespace metrale::vision {

// Frames to keep, in order. `video_fps` is the decoded stream's native rate; the duration is
// taken as total_frames / video_fps, as transformers' own video decoders report it. When
// config.do_sample_frames is false every frame is kept.
std::vector<int64_t> sample_frame_indices(const VideoProcessorConfig& config, int64_t total_frames,
                                          double video_fps);

// Seconds for each temporal patch (one per grid_t) of a video built from `indices`:
//   Qwen3-VL: mean of the first and last frame time in the patch (processing_qwen3_vl.py);
//   GLM-4V:   time of the patch's first frame (processing_glm4v.py takes timestamps[::2]);
//   Qwen2-VL: time of the patch's first frame (its mrope uses temporal_patch_size / fps).
std::vector<double> temporal_patch_timestamps(VideoFamily family, std::span<const int64_t> indices,
                                              double video_fps, int temporal_patch_size);

}  // namespace metrale::vision
