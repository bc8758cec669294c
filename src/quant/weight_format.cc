#include "quant/weight_format.h"

#include <array>
#include <cstring>

#include "core/error.h"

namespace metrale {
namespace {

// Indexed by WeightFormat; a new format adds one row here and its kernels in the backends.
constexpr std::array<WeightFormatInfo, 2> kFormats = {{
    {WeightFormat::kF32, "f32", DType::kF32, 1, 4},
    {WeightFormat::kBF16, "bf16", DType::kBF16, 1, 2},
}};

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
  }
  throw make_error("dequantize_row: unknown weight format code ", static_cast<int>(f));
}

}  // namespace metrale
