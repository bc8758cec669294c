#pragma once
// Frame sampling and per-temporal-patch timestamps, as each HF video processor's
// sample_frames (transformers 5.24) does it. Indices refer to the decoded frame list; the
// float arithmetic (torch.arange in float32, numpy linspace + round-half-even, Python int()
// truncation, math.ceil) is reproduced so the same frames are picked.
#include <cstdint>
#include <span>
#include <string>
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

// Qwen2.5-VL's second_per_grid_ts of a video (processing_qwen2_5_vl.py): temporal_patch_size /
// VideoMetadata.sampled_fps, where sampled_fps = len(indices) / total_frames * fps in float64
// (fps itself when the indices or the frame count are unknown, 24 when the rate is), then
// float32 as the processor's tensor holds it.
float second_per_grid(std::span<const int64_t> indices, int64_t total_frames, double fps,
                      int temporal_patch_size);

// The text Qwen3-VL / Qwen3.5's processor writes before each temporal patch of a video:
// "<%.1f seconds>" (Python's f"<{t:.1f} seconds>", correctly rounded as printf is).
std::string timestamp_text(double seconds);

}  // namespace metrale::vision
