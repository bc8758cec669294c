#include "vision/resize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"

namespace metrale::vision {
namespace {

constexpr double kSupport = 2.0;   // bicubic filter support before anti-alias widening
constexpr int kPilPrecision = 22;  // PIL's PRECISION_BITS = 32 - 8 - 2
constexpr int kTorchMaxPrecision = 22;

double pil_cubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double torch_cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// Fixed-point filter bank for one axis: output i reads `count[i]` inputs from `start[i]`
// with weights `weights[i * ksize ...]`, scaled by 2^precision.
struct AxisFilter {
  int ksize = 0;
  int precision = 0;
  std::vector<int> start;
  std::vector<int> count;
  std::vector<int32_t> weights;
};

int32_t to_fixed(double w, int precision) {
  const double v = w * static_cast<double>(1 << precision);
  return static_cast<int32_t>(v < 0 ? -0.5 + v : 0.5 + v);
}

AxisFilter make_filter(int in_size, int out_size, ResizeKernel kernel) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = kSupport * filterscale;
  const double inv_filterscale = 1.0 / filterscale;
  AxisFilter f;
  f.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  f.start.resize(static_cast<size_t>(out_size));
  f.count.resize(static_cast<size_t>(out_size));
  std::vector<double> w(static_cast<size_t>(out_size) * f.ksize, 0.0);
  double w_max = 0.0;
  const bool pil = kernel == ResizeKernel::kPil;
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    int lo = static_cast<int>(center - support + 0.5);
    if (lo < 0) lo = 0;
    int hi = static_cast<int>(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    // torch clips the tap count to ksize (a rounding guard); PIL's never exceeds it.
    const int n = std::clamp(hi - lo, 0, f.ksize);
    double* k = &w[static_cast<size_t>(i) * f.ksize];
    double total = 0.0;
    for (int j = 0; j < n; ++j) {
      const double x = (j + lo - center + 0.5) * inv_filterscale;
      k[j] = pil ? pil_cubic(x) : torch_cubic(x);
      total += k[j];
    }
    if (total != 0.0) {
      for (int j = 0; j < n; ++j) {
        k[j] /= total;
        w_max = std::max(w_max, k[j]);
      }
    }
    f.start[static_cast<size_t>(i)] = lo;
    f.count[static_cast<size_t>(i)] = n;
  }
  if (pil) {
    f.precision = kPilPrecision;
  } else {
    // torch: as many bits as keep 2 * w_max representable in int16.
    int p = 0;
    for (; p < kTorchMaxPrecision; ++p) {
      const int next = static_cast<int>(0.5 + w_max * (1 << (p + 1)));
      if (next >= (1 << 15)) break;
    }
    f.precision = p;
  }
  f.weights.resize(w.size());
  for (size_t i = 0; i < w.size(); ++i) f.weights[i] = to_fixed(w[i], f.precision);
  return f;
}

inline uint8_t clip_shift(int32_t acc, int precision) {
  const int32_t v = acc >> precision;  // arithmetic shift: floor, as both peers do
  return static_cast<uint8_t>(std::clamp<int32_t>(v, 0, 255));
}

// Resamples columns: rows [row0, row0 + n_rows) of `in` -> `out` (width = filter size).
Image horizontal_pass(const Image& in, int row0, int n_rows, int out_width, const AxisFilter& f) {
  Image out;
  out.width = out_width;
  out.height = n_rows;
  out.rgb.resize(static_cast<size_t>(out_width) * n_rows * 3);
  const int32_t bias = 1 << (f.precision - 1);
  for (int y = 0; y < n_rows; ++y) {
    const uint8_t* src = in.row(row0 + y);
    uint8_t* dst = out.row(y);
    for (int x = 0; x < out_width; ++x) {
      const int32_t* k = &f.weights[static_cast<size_t>(x) * f.ksize];
      const uint8_t* s = src + static_cast<size_t>(f.start[static_cast<size_t>(x)]) * 3;
      int32_t r = bias, g = bias, b = bias;
      for (int j = 0, n = f.count[static_cast<size_t>(x)]; j < n; ++j) {
        r += s[j * 3 + 0] * k[j];
        g += s[j * 3 + 1] * k[j];
        b += s[j * 3 + 2] * k[j];
      }
      dst[x * 3 + 0] = clip_shift(r, f.precision);
      dst[x * 3 + 1] = clip_shift(g, f.precision);
      dst[x * 3 + 2] = clip_shift(b, f.precision);
    }
  }
  return out;
}

// Resamples rows: output row i reads `in` rows start[i] - row0 ... (row0: first row `in` holds).
Image vertical_pass(const Image& in, int row0, int out_height, const AxisFilter& f) {
  Image out;
  out.width = in.width;
  out.height = out_height;
  out.rgb.resize(static_cast<size_t>(in.width) * out_height * 3);
  const int32_t bias = 1 << (f.precision - 1);
  const size_t row_bytes = static_cast<size_t>(in.width) * 3;
  std::vector<int32_t> acc(row_bytes);
  for (int y = 0; y < out_height; ++y) {
    std::fill(acc.begin(), acc.end(), bias);
    const int32_t* k = &f.weights[static_cast<size_t>(y) * f.ksize];
    const int first = f.start[static_cast<size_t>(y)] - row0;
    for (int j = 0, n = f.count[static_cast<size_t>(y)]; j < n; ++j) {
      const uint8_t* src = in.row(first + j);
      const int32_t kj = k[j];
      for (size_t i = 0; i < row_bytes; ++i) acc[i] += src[i] * kj;
    }
    uint8_t* dst = out.row(y);
    for (size_t i = 0; i < row_bytes; ++i) dst[i] = clip_shift(acc[i], f.precision);
  }
  return out;
}

}  // namespace

const char* resize_kernel_name(ResizeKernel kernel) {
  return kernel == ResizeKernel::kPil ? "pil" : "torchvision";
}

Image resize_bicubic(const Image& in, int out_width, int out_height, ResizeKernel kernel) {
  METRALE_CHECK(in.width > 0 && in.height > 0, "resize: empty input image (", in.width, "x",
                in.height, ")");
  METRALE_CHECK(in.rgb.size() == static_cast<size_t>(in.width) * in.height * 3,
                "resize: image buffer holds ", in.rgb.size(), " bytes, expected ",
                static_cast<size_t>(in.width) * in.height * 3);
  METRALE_CHECK(out_width > 0 && out_height > 0, "resize: output size must be positive, got ",
                out_width, "x", out_height);
  // Sizes past 2^24 would overflow the filter banks and are far beyond any processor's limits.
  constexpr int kMaxSide = 1 << 24;
  METRALE_CHECK(out_width <= kMaxSide && out_height <= kMaxSide, "resize: output size ", out_width,
                "x", out_height, " exceeds ", kMaxSide, " per side");
  const bool need_h = out_width != in.width;
  const bool need_v = out_height != in.height;
  if (!need_h && !need_v) return in;

  const bool horizontal_first =
      kernel == ResizeKernel::kTorchvision ||
      !((in.height - out_height) > 0 && (in.height - out_height) > (in.width - out_width) * 2);

  if (!need_v)
    return horizontal_pass(in, 0, in.height, out_width, make_filter(in.width, out_width, kernel));
  const AxisFilter fv = make_filter(in.height, out_height, kernel);
  if (!need_h) return vertical_pass(in, 0, out_height, fv);
  const AxisFilter fh = make_filter(in.width, out_width, kernel);
  if (horizontal_first) {
    // Only the source rows the vertical pass reads are resampled horizontally.
    const int first = fv.start.front();
    const int last = fv.start.back() + fv.count.back();
    Image tmp = horizontal_pass(in, first, last - first, out_width, fh);
    return vertical_pass(tmp, first, out_height, fv);
  }
  Image tmp = vertical_pass(in, 0, out_height, fv);
  return horizontal_pass(tmp, 0, out_height, out_width, fh);
}

}  // namespace metrale::vision
