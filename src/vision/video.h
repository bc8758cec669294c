#pragma once
// Video input: GIF animations decoded in-process (frames as PIL composes them), every other
// container decoded by an ffmpeg child process (see ffmpeg.h) into RGB8 frames.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vision/decode.h"

namespace metrale::vision {

struct VideoOptions {
  DecodeLimits limits;                        // per frame
  double timeout_s = 120.0;                   // per ffmpeg/ffprobe run
  size_t max_output_bytes = size_t(2) << 30;  // decoded bytes (ffmpeg stdout, GIF frames)
  size_t max_frames = 10000;
  // Decode only these 0-based frame indices (ascending, unique); empty -> every frame.
  std::vector<int64_t> frame_indices;
};

struct VideoFrames {
  double fps = 0;            // native frame rate; 0 when unknown
  int64_t total_frames = 0;  // frames in the stream (not just the ones decoded)
  std::vector<Image> frames;
  std::vector<int64_t> indices;   // stream index of each decoded frame
  std::vector<int> durations_ms;  // GIF only: per decoded frame
};

// Container + stream facts without decoding pixels (ffprobe; GIFs parsed in-process).
struct VideoInfo {
  double fps = 0;
  int64_t total_frames = 0;
  int width = 0;
  int height = 0;
};

bool is_gif(std::span<const uint8_t> bytes);

VideoInfo probe_video(std::span<const uint8_t> bytes, const VideoOptions& options = {});
VideoFrames decode_video(std::span<const uint8_t> bytes, const VideoOptions& options = {});
// Same, reading a file by path (ffmpeg reads it directly; no temporary copy).
VideoFrames decode_video_file(const std::string& path, const VideoOptions& options = {});

}  // namespace metrale::vision
