#include "layers/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace metrale {
namespace {

// HF: base ** (arange(0, dim, 2).float() / dim), evaluated in float32. torch's powf is
// within an ulp of the exact result; pow in double rounded once is the closest we can get.
float pos_freq(double base, int64_t i, int64_t dim) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
  return static_cast<float>(
      std::pow(static_cast<double>(static_cast<float>(base)), static_cast<double>(e)));
}

double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// HF find_correction_dim: the dimension at which `rotations` full turns happen over the
// original context.
double correction_dim(double rotations, int64_t dim, double base, double max_pos) {
  return (static_cast<double>(dim) * std::log(max_pos / (rotations * 2.0 * std::numbers::pi))) /
         (2.0 * std::log(base));
}

void yarn_inv_freq(const RopeTableConfig& c, int64_t dim, std::vector<float>& inv, float* scaling) {
  METRALE_CHECK(
      c.original_max_position_embeddings > 0,
      "rope_parameters.original_max_position_embeddings: yarn needs a positive value, found ",
      c.original_max_position_embeddings);
  double attention = c.attention_factor;
  if (attention <= 0.0) {
    attention = (c.mscale != 0.0 && c.mscale_all_dim != 0.0)
                    ? yarn_mscale(c.factor, c.mscale) / yarn_mscale(c.factor, c.mscale_all_dim)
                    : yarn_mscale(c.factor, 1.0);
  }
  *scaling = static_cast<float>(attention);
  const double omax = static_cast<double>(c.original_max_position_embeddings);
  double low = correction_dim(c.beta_fast, dim, c.theta, omax);
  double high = correction_dim(c.beta_slow, dim, c.theta, omax);
  if (c.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF: prevent a singular ramp
  const float fmin = static_cast<float>(low);
  const float frange = static_cast<float>(high - low);
  const float ffactor = static_cast<float>(c.factor);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float p = pos_freq(c.theta, i, dim);
    const float extrapolation = 1.0f / p;
    const float interpolation = 1.0f / (ffactor * p);
    const float ramp = std::clamp((static_cast<float>(i) - fmin) / frange, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[static_cast<size_t>(i)] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
}

void llama3_inv_freq(const RopeTableConfig& c, std::vector<float>& inv) {
  METRALE_CHECK(
      c.original_max_position_embeddings > 0,
      "rope_parameters.original_max_position_embeddings: llama3 needs a positive value, found ",
      c.original_max_position_embeddings);
  METRALE_CHECK(c.high_freq_factor != c.low_freq_factor,
                "rope_parameters: llama3 needs high_freq_factor != low_freq_factor, both are ",
                c.low_freq_factor);
  const double old_len = static_cast<double>(c.original_max_position_embeddings);
  // HF compares and divides float32 tensors by Python scalars: the scalars become float32.
  const float low_wavelen = static_cast<float>(old_len / c.low_freq_factor);
  const float high_wavelen = static_cast<float>(old_len / c.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float factor = static_cast<float>(c.factor);
  const float fold = static_cast<float>(old_len);
  const float flow = static_cast<float>(c.low_freq_factor);
  const float fspan = static_cast<float>(c.high_freq_factor - c.low_freq_factor);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const float smooth = (fold / wavelen - flow) / fspan;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : scaled;
  }
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeTableConfig& c, float* attention_scaling) {
  METRALE_CHECK(c.head_dim > 0, "rope: head_dim must be positive, found ", c.head_dim);
  METRALE_CHECK(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0,
                "rope: partial_rotary_factor must be in (0, 1], found ", c.partial_rotary_factor);
  METRALE_CHECK(c.theta > 0.0, "rope: rope_theta must be positive, found ", c.theta);
  const auto dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
  METRALE_CHECK(dim >= 2 && dim % 2 == 0, "rope: rotary dimension int(head_dim ", c.head_dim,
                " * partial_rotary_factor ", c.partial_rotary_factor, ") = ", dim,
                " must be even and >= 2");
  if (c.type != RopeType::kDefault) {
    METRALE_CHECK(c.factor > 0.0, "rope_parameters.factor must be positive, found ", c.factor);
  }
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  *attention_scaling = 1.0f;
  if (c.type == RopeType::kYarn) {
    yarn_inv_freq(c, dim, inv, attention_scaling);
    return inv;
  }
  for (int64_t i = 0; i < dim / 2; ++i)
    inv[static_cast<size_t>(i)] = 1.0f / pos_freq(c.theta, i, dim);
  if (c.type == RopeType::kLinear) {
    const float factor = static_cast<float>(c.factor);
    for (float& f : inv) f /= factor;
  } else if (c.type == RopeType::kLlama3) {
    llama3_inv_freq(c, inv);
  }
  return inv;
}

RopeTable RopeTable::build(const RopeTableConfig& config, int64_t max_positions) {
  METRALE_CHECK(max_positions > 0, "rope: max_positions must be positive, found ", max_positions);
  RopeTable t;
  t.inv_freq_ = rope_inv_freq(config, &t.attention_scaling_);
  const auto half = static_cast<int64_t>(t.inv_freq_.size());
  t.rotary_dim_ = 2 * half;
  t.max_positions_ = max_positions;
  t.cos_.resize(static_cast<size_t>(max_positions * half));
  t.sin_.resize(static_cast<size_t>(max_positions * half));
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      // HF: freqs = position.float() * inv_freq (float32); cos/sin then times the scaling.
      const float freq = static_cast<float>(p) * t.inv_freq_[static_cast<size_t>(i)];
      const auto at = static_cast<size_t>(p * half + i);
      t.cos_[at] = static_cast<float>(std::cos(static_cast<double>(freq))) * t.attention_scaling_;
      t.sin_[at] = static_cast<float>(std::sin(static_cast<double>(freq))) * t.attention_scaling_;
    }
  }
  return t;
}

RopeTableConfig rope_table_config(const ModelConfig& c) {
  const RopeConfig& r = c.rope;
  RopeTableConfig t{.type = r.type,
                    .theta = r.theta,
                    .head_dim = c.head_dim,
                    .partial_rotary_factor = r.partial_rotary_factor,
                    .factor = r.factor,
                    .original_max_position_embeddings = r.original_max_position_embeddings};
  if (r.type == RopeType::kLlama3) {
    t.low_freq_factor = r.low_freq_factor;
    t.high_freq_factor = r.high_freq_factor;
  }
  if (r.type == RopeType::kYarn) {
    t.beta_fast = r.beta_fast;
    t.beta_slow = r.beta_slow;
    t.truncate = r.truncate;
    t.attention_factor = r.attention_factor;  // already derived as HF does by the config parser
  }
  return t;
}

std::vector<int32_t> mrope_axes(std::span<const int64_t> section, bool interleaved, int64_t half) {
  METRALE_CHECK(section.size() == 3 && half > 0, "mrope: expected 3 sections and half > 0");
  std::vector<int32_t> axes(static_cast<size_t>(half), 0);
  for (int64_t i = 0; i < half; ++i) {
    int32_t a = 0;
    if (interleaved) {
      if (i % 3 == 1 && i < 3 * section[1]) a = 1;
      if (i % 3 == 2 && i < 3 * section[2]) a = 2;
    } else {
      a = i < section[0] ? 0 : i < section[0] + section[1] ? 1 : 2;
    }
    axes[static_cast<size_t>(i)] = a;
  }
  return axes;
}

}  // namespace metrale
