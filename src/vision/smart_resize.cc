#include "vision/smart_resize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace metrale::vision {
namespace {

// Python's round() on a float: ties go to the even neighbour (the default FE_TONEAREST mode).
int64_t py_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// Largest side/count we accept: keeps every product below 2^53, where Python's exact
// integer arithmetic and our doubles agree.
constexpr int64_t kMaxSide = int64_t{1} << 20;
constexpr int64_t kMaxPixels = int64_t{1} << 40;

void check_common(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                  int64_t max_pixels) {
  METRALE_CHECK(height > 0 && width > 0, "smart_resize: image size must be positive, got ", width,
                "x", height);
  METRALE_CHECK(height <= kMaxSide && width <= kMaxSide, "smart_resize: image size ", width, "x",
                height, " exceeds ", kMaxSide, " per side");
  METRALE_CHECK(factor > 0 && factor <= 4096,
                "smart_resize: factor (patch_size * merge_size) must be in [1, 4096], got ",
                factor);
  METRALE_CHECK(min_pixels >= 0 && max_pixels > 0 && max_pixels <= kMaxPixels,
                "smart_resize: min_pixels/max_pixels must be in [0, 2^40] and max_pixels > 0, got ",
                min_pixels, "/", max_pixels);
  METRALE_CHECK(min_pixels <= max_pixels, "smart_resize: min_pixels (", min_pixels,
                ") exceeds max_pixels (", max_pixels, ")");
}

void check_aspect(int64_t height, int64_t width) {
  const double ratio =
      static_cast<double>(std::max(height, width)) / static_cast<double>(std::min(height, width));
  METRALE_CHECK(ratio <= 200, "smart_resize: absolute aspect ratio must be at most 200, got ",
                ratio, " (", width, "x", height, ")");
}

ResizeTarget finish(int64_t h_bar, int64_t w_bar, int64_t height, int64_t width) {
  METRALE_CHECK(h_bar > 0 && w_bar > 0, "smart_resize: ", width, "x", height,
                " resizes to an empty ", w_bar, "x", h_bar,
                " image (min_pixels too small for this factor)");
  METRALE_CHECK(h_bar <= kMaxSide && w_bar <= kMaxSide, "smart_resize: ", width, "x", height,
                " resizes to ", w_bar, "x", h_bar, ", beyond ", kMaxSide, " per side");
  return {static_cast<int>(h_bar), static_cast<int>(w_bar)};
}

}  // namespace

ResizeTarget qwen_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                               int64_t max_pixels) {
  check_common(height, width, factor, min_pixels, max_pixels);
  check_aspect(height, width);
  const double f = static_cast<double>(factor);
  int64_t h_bar = py_round(static_cast<double>(height) / f) * factor;
  int64_t w_bar = py_round(static_cast<double>(width) / f) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta =
        std::sqrt(static_cast<double>(height * width) / static_cast<double>(max_pixels));
    h_bar = std::max(
        factor, static_cast<int64_t>(std::floor(static_cast<double>(height) / beta / f)) * factor);
    w_bar = std::max(
        factor, static_cast<int64_t>(std::floor(static_cast<double>(width) / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta =
        std::sqrt(static_cast<double>(min_pixels) / static_cast<double>(height * width));
    h_bar = static_cast<int64_t>(std::ceil(static_cast<double>(height) * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(static_cast<double>(width) * beta / f)) * factor;
  }
  return finish(h_bar, w_bar, height, width);
}

ResizeTarget temporal_smart_resize(int64_t num_frames, int64_t height, int64_t width,
                                   int64_t temporal_factor, int64_t factor, int64_t min_pixels,
                                   int64_t max_pixels) {
  check_common(height, width, factor, min_pixels, max_pixels);
  METRALE_CHECK(temporal_factor > 0 && temporal_factor <= 64,
                "smart_resize: temporal factor must be in [1, 64], got ", temporal_factor);
  METRALE_CHECK(num_frames >= temporal_factor && num_frames <= 100000,
                "smart_resize: t:", num_frames,
                " must be at least temporal_factor:", temporal_factor, " (and at most 100000)");
  const double f = static_cast<double>(factor);
  if (height < factor || width < factor) {
    const double scale = std::max(f / static_cast<double>(height), f / static_cast<double>(width));
    height = static_cast<int64_t>(static_cast<double>(height) * scale);  // Python int(): truncation
    width = static_cast<int64_t>(static_cast<double>(width) * scale);
    METRALE_CHECK(height > 0 && width > 0 && height <= kMaxSide && width <= kMaxSide,
                  "smart_resize: upscaled size ", width, "x", height, " is out of range");
  }
  check_aspect(height, width);
  int64_t h_bar = py_round(static_cast<double>(height) / f) * factor;
  int64_t w_bar = py_round(static_cast<double>(width) / f) * factor;
  const int64_t t_bar =
      py_round(static_cast<double>(num_frames) / static_cast<double>(temporal_factor)) *
      temporal_factor;
  if (t_bar * h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(static_cast<double>(num_frames * height * width) /
                                  static_cast<double>(max_pixels));
    h_bar = std::max(
        factor, static_cast<int64_t>(std::floor(static_cast<double>(height) / beta / f)) * factor);
    w_bar = std::max(
        factor, static_cast<int64_t>(std::floor(static_cast<double>(width) / beta / f)) * factor);
  } else if (t_bar * h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) /
                                  static_cast<double>(num_frames * height * width));
    h_bar = static_cast<int64_t>(std::ceil(static_cast<double>(height) * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(static_cast<double>(width) * beta / f)) * factor;
  }
  return finish(h_bar, w_bar, height, width);
}

}  // namespace metrale::vision
