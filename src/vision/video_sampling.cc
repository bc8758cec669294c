#include "vision/video_sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "core/error.h"

namespace metrale::vision {
namespace {

std::vector<int64_t> all_frames(int64_t total) {
  std::vector<int64_t> v(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// numpy.linspace(start, stop, num) (endpoint=True) in float64: i * step, last = stop.
std::vector<double> linspace(double start, double stop, int64_t num) {
  std::vector<double> y(static_cast<size_t>(std::max<int64_t>(num, 0)));
  if (num <= 0) return y;
  const int64_t div = num - 1;
  const double delta = stop - start;
  if (div > 0) {
    const double step = delta / static_cast<double>(div);
    for (int64_t i = 0; i < num; ++i) {
      // numpy's denormal guard: a zero step divides first, then multiplies.
      const double v = step == 0 ? static_cast<double>(i) / static_cast<double>(div) * delta
                                 : static_cast<double>(i) * step;
      y[static_cast<size_t>(i)] = v + start;
    }
    y.back() = stop;
  } else {
    y[0] = 0.0 * delta + start;
  }
  return y;
}

// Qwen2VLVideoProcessor.sample_frames.
std::vector<int64_t> sample_qwen2(const VideoProcessorConfig& c, int64_t total, double video_fps) {
  METRALE_CHECK(!(c.fps && c.num_frames),
                "video sampling: `num_frames` and `fps` are mutually exclusive");
  const int64_t tps = c.geometry.temporal_patch_size;
  int64_t num = -1;  // -1: keep every frame
  if (c.num_frames) {
    num = static_cast<int64_t>(
              std::nearbyint(static_cast<double>(*c.num_frames) / static_cast<double>(tps))) *
          tps;
  } else if (c.fps) {
    const double max_frames =
        std::floor(static_cast<double>(std::min<int64_t>(c.max_frames, total)) /
                   static_cast<double>(tps)) *
        static_cast<double>(tps);
    double n = static_cast<double>(total) / video_fps * *c.fps;
    n = std::min(
        {std::max(n, static_cast<double>(c.min_frames)), max_frames, static_cast<double>(total)});
    num = static_cast<int64_t>(std::floor(n / static_cast<double>(tps))) * tps;
  }
  if (num < 0) return all_frames(total);
  METRALE_CHECK(num <= total, "video sampling: the inferred num_frames=", num,
                " exceeds total_num_frames=", total);
  METRALE_CHECK(num > 0, "video sampling: no frames to sample (", total,
                " frames, temporal_patch_size ", tps, ", max_frames ", c.max_frames, ")");
  // torch.arange(0, total, total / num).int(): length ceil(total / step) computed in double,
  // values start + i * step in double, stored as float32, then truncated.
  const double step = static_cast<double>(total) / static_cast<double>(num);
  const auto size = static_cast<int64_t>(std::ceil(static_cast<double>(total) / step));
  std::vector<int64_t> idx(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const float v = static_cast<float>(static_cast<double>(i) * step);
    idx[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return idx;
}

// Qwen3VLVideoProcessor.sample_frames.
std::vector<int64_t> sample_qwen3(const VideoProcessorConfig& c, int64_t total, double video_fps) {
  METRALE_CHECK(!(c.fps && c.num_frames),
                "video sampling: `num_frames` and `fps` are mutually exclusive");
  int64_t num = 0;
  if (c.num_frames) {
    num = *c.num_frames;
  } else if (c.fps) {
    num =
        static_cast<int64_t>(static_cast<double>(total) / video_fps * *c.fps);  // int(): truncation
    num =
        std::min({std::max<int64_t>(num, c.min_frames), static_cast<int64_t>(c.max_frames), total});
  } else {
    num = std::min(std::max<int64_t>(total, c.min_frames), static_cast<int64_t>(c.max_frames));
  }
  std::vector<int64_t> idx;
  for (double t : linspace(0.0, static_cast<double>(total - 1), num)) {
    idx.push_back(static_cast<int64_t>(std::nearbyint(t)));  // ndarray.round(): half to even
  }
  return idx;
}

// Glm4vVideoProcessor.sample_frames.
std::vector<int64_t> sample_glm4v(const VideoProcessorConfig& c, int64_t total, double video_fps) {
  METRALE_CHECK(c.fps.has_value(),
                "video sampling: GLM-4V samples by fps, but the config sets none");
  const double requested_fps = *c.fps;
  const int64_t max_idx = total - 1;
  double duration = static_cast<double>(total) / video_fps;
  if (duration == 0.0) duration = std::nearbyint(static_cast<double>(max_idx) / video_fps) + 1;
  std::vector<int64_t> picked;
  if (duration <= c.max_duration) {
    const int64_t n =
        std::max<int64_t>(static_cast<int64_t>(std::floor(duration * requested_fps)), 1);
    for (int64_t i = 0; i < n; ++i) {
      const double t = static_cast<double>(i) * video_fps / requested_fps;
      picked.push_back(std::min(max_idx, static_cast<int64_t>(std::ceil(t))));
    }
  } else {
    const auto num_samples = static_cast<int64_t>(c.max_duration * requested_fps);
    if (num_samples >= total) {
      picked = all_frames(total);
    } else {
      for (double t : linspace(0.0, duration, num_samples)) {
        picked.push_back(std::min(max_idx, static_cast<int64_t>(std::ceil(t * video_fps))));
      }
    }
  }
  std::vector<int64_t> uniq;
  std::unordered_set<int64_t> seen;
  for (int64_t i : picked) {
    if (seen.insert(i).second) uniq.push_back(i);
  }
  if (uniq.size() & 1) uniq.push_back(uniq.back());
  return uniq;
}

}  // namespace

std::vector<int64_t> sample_frame_indices(const VideoProcessorConfig& config, int64_t total_frames,
                                          double video_fps) {
  METRALE_CHECK(total_frames > 0, "video sampling: the video has no frames");
  METRALE_CHECK(total_frames <= 10'000'000, "video sampling: ", total_frames,
                " frames is beyond the supported count");
  if (!config.do_sample_frames) return all_frames(total_frames);
  METRALE_CHECK(std::isfinite(video_fps) && video_fps > 0,
                "video sampling: the video's frame rate must be positive, got ", video_fps);
  switch (config.family) {
    case VideoFamily::kQwen2Vl:
      return sample_qwen2(config, total_frames, video_fps);
    case VideoFamily::kQwen3Vl:
      return sample_qwen3(config, total_frames, video_fps);
    case VideoFamily::kGlm4v:
      return sample_glm4v(config, total_frames, video_fps);
  }
  return {};
}

std::vector<double> temporal_patch_timestamps(VideoFamily family, std::span<const int64_t> indices,
                                              double video_fps, int temporal_patch_size) {
  std::vector<double> out;
  if (indices.empty() || !(video_fps > 0)) return out;
  std::vector<int64_t> idx(indices.begin(), indices.end());
  const auto tps = static_cast<size_t>(temporal_patch_size);
  while (idx.size() % tps != 0) idx.push_back(idx.back());
  for (size_t i = 0; i < idx.size(); i += tps) {
    const double first = static_cast<double>(idx[i]) / video_fps;
    const double last = static_cast<double>(idx[i + tps - 1]) / video_fps;
    out.push_back(family == VideoFamily::kQwen3Vl ? (first + last) / 2 : first);
  }
  return out;
}

float second_per_grid(std::span<const int64_t> indices, int64_t total_frames, double fps,
                      int temporal_patch_size) {
  double sampled = fps > 0 ? fps : 24.0;
  if (fps > 0 && total_frames > 0 && !indices.empty()) {
    sampled = static_cast<double>(indices.size()) / static_cast<double>(total_frames) * fps;
  }
  return static_cast<float>(static_cast<double>(temporal_patch_size) / sampled);
}

std::string timestamp_text(double seconds) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof(buf), "<%.1f seconds>", seconds);
  METRALE_CHECK(n > 0 && static_cast<size_t>(n) < sizeof(buf), "video timestamp ", seconds,
                " s is out of range");
  return {buf, static_cast<size_t>(n)};
}

}  // namespace metrale::vision
