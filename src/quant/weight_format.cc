#include "quant/weight_format.h"

#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace metrale {
namespace {

// Indexed by WeightFormat; a new format adds one row here and its kernels in the backends.
constexpr std::array<WeightFormatInfo, kWeightFormatCount> kFormats = {{
    {WeightFormat::kF32, "f32", DType::kF32, 1, 4, false},
    {WeightFormat::kBF16, "bf16", DType::kBF16, 1, 2, false},
    {WeightFormat::kInt4, "int4", DType::kU8, 2, 1, true},
    {WeightFormat::kInt8, "int8", DType::kI8, 1, 1, true},
    {WeightFormat::kFp8, "fp8", DType::kF8E4M3, 1, 1, true},
    {WeightFormat::kNvfp4, "nvfp4", DType::kE2M1, 2, 1, true},
}};

float scale_value(const QuantParams& q, size_t i) {
  switch (q.scale_dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, static_cast<const float*>(q.scales) + i, sizeof v);
      return v;
    }
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(q.scales)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(q.scales)[i]);
    case DType::kF8E4M3:
      return f8e4m3_to_f32(static_cast<const uint8_t*>(q.scales)[i]);
    default:
      throw make_error("quantized weight: scale dtype ", dtype_name(q.scale_dtype),
                       " is not one of f32, bf16, f16, f8_e4m3");
  }
}

}  // namespace

const WeightFormatInfo& weight_format_info(WeightFormat f) {
  const auto i = static_cast<size_t>(f);
  METRALE_CHECK(i < kFormats.size(), "unknown weight format code ", i);
  return kFormats[i];
}

std::string_view weight_format_name(WeightFormat f) { return weight_format_info(f).name; }

std::optional<WeightFormat> weight_format_for_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return WeightFormat::kF32;
    case DType::kBF16:
      return WeightFormat::kBF16;
    default:
      return std::nullopt;
  }
}

size_t weight_row_bytes(WeightFormat f, int64_t n_in) {
  const WeightFormatInfo& info = weight_format_info(f);
  METRALE_CHECK(n_in >= 0 && n_in % info.block == 0, "weight format ", info.name, ": row of ", n_in,
                " values is not a multiple of the block size ", info.block);
  return static_cast<size_t>(n_in / info.block * info.block_bytes);
}

float quant_scale(const QuantParams& q, int64_t row, int64_t g) {
  return scale_value(q, static_cast<size_t>(row * q.n_groups + g)) * q.scale_global;
}

void validate_quant_params(WeightFormat f, const QuantParams& q, int64_t n_out, int64_t n_in,
                           std::string_view name) {
  if (!is_quantized(f)) return;
  const std::string_view fmt = weight_format_name(f);
  METRALE_CHECK(q.scales != nullptr, "weight '", name, "' (", fmt, "): no scales");
  METRALE_CHECK(q.scale_dtype == DType::kF32 || q.scale_dtype == DType::kBF16 ||
                    q.scale_dtype == DType::kF16 || q.scale_dtype == DType::kF8E4M3,
                "weight '", name, "' (", fmt, "): scale dtype ", dtype_name(q.scale_dtype),
                " is not one of f32, bf16, f16, f8_e4m3");
  METRALE_CHECK(std::isfinite(q.scale_global) && q.scale_global > 0.0f, "weight '", name, "' (",
                fmt, "): global scale ", q.scale_global, " is not a finite positive number");
  METRALE_CHECK(q.group > 0 && q.group <= n_in, "weight '", name, "' (", fmt, "): group size ",
                q.group, " is outside [1, ", n_in, "]");
  const int64_t groups = quant_groups(n_in, q.group);
  if (q.g_idx == nullptr) {
    METRALE_CHECK(q.n_groups == groups, "weight '", name, "' (", fmt, "): ", q.n_groups,
                  " scale columns, expected ", groups, " (", n_in, " inputs in groups of ", q.group,
                  ")");
  } else {
    METRALE_CHECK(q.n_groups >= 1, "weight '", name, "' (", fmt, "): no scale columns");
    for (int64_t k = 0; k < n_in; ++k) {
      METRALE_CHECK(q.g_idx[k] >= 0 && q.g_idx[k] < q.n_groups, "weight '", name, "' (", fmt,
                    "): g_idx[", k, "] = ", q.g_idx[k], " is outside [0, ", q.n_groups, ")");
    }
  }
  METRALE_CHECK(q.zeros == nullptr || f == WeightFormat::kInt4 || f == WeightFormat::kInt8,
                "weight '", name, "' (", fmt, "): zero points only exist for integer formats");
  if (q.zeros != nullptr && f == WeightFormat::kInt4) {
    for (int64_t i = 0; i < n_out * q.n_groups; ++i) {
      METRALE_CHECK(q.zeros[i] >= -8 && q.zeros[i] <= 7, "weight '", name, "' (int4): zero point ",
                    static_cast<int>(q.zeros[i]), " is outside [-8, 7]");
    }
  }
  for (int64_t i = 0; i < n_out * q.n_groups; ++i) {
    const float s = scale_value(q, static_cast<size_t>(i)) * q.scale_global;
    METRALE_CHECK(std::isfinite(s), "weight '", name, "' (", fmt, "): scale of row ",
                  i / q.n_groups, " group ", i % q.n_groups, " is ", s);
  }
}

void dequantize_row(WeightFormat f, const void* row_codes, const QuantParams& q, int64_t row,
                    int64_t n_in, float* out) {
  if (!is_quantized(f)) return dequantize_row(f, row_codes, n_in, out);
  const auto* b = static_cast<const uint8_t*>(row_codes);
  for (int64_t k = 0; k < n_in; ++k) {
    const int64_t g = q.g_idx != nullptr ? q.g_idx[k] : k / q.group;
    const float s = quant_scale(q, row, g);
    const int z = q.zeros != nullptr ? q.zeros[row * q.n_groups + g] : 0;
    float v = 0.0f;
    switch (f) {
      case WeightFormat::kInt4: {
        const int nibble = (b[k / 2] >> (4 * (k % 2))) & 0xF;
        v = static_cast<float>(nibble - 8 - z) * s;
        break;
      }
      case WeightFormat::kInt8:
        v = static_cast<float>(static_cast<int8_t>(b[k]) - z) * s;
        break;
      case WeightFormat::kFp8:
        v = f8e4m3_to_f32(b[k]) * s;
        break;
      case WeightFormat::kNvfp4:
        v = e2m1_to_f32(static_cast<uint8_t>(b[k / 2] >> (4 * (k % 2)))) * s;
        break;
      default:
        throw make_error("dequantize_row: unknown weight format code ", static_cast<int>(f));
    }
    out[k] = v;
  }
}

void dequantize_row(WeightFormat f, const void* row, int64_t n_in, float* out) {
  switch (f) {
    case WeightFormat::kF32:
      std::memcpy(out, row, static_cast<size_t>(n_in) * sizeof(float));
      return;
    case WeightFormat::kBF16: {
      const auto* p = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n_in; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    default:
      throw make_error("dequantize_row: weight format ", weight_format_name(f),
                       " needs its quantization parameters");
  }
}

}  // namespace metrale
