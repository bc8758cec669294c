#pragma once
// Weight formats: how one row of a [out, in] weight matrix is stored. This table is the one
// place that knows the byte layout of each format; backends look a format up here and pick
// a kernel per format, so a quantized layout arrives as one more row of the table plus its
// kernels, never as an if-chain in a layer.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/dtype.h"

namespace metrale {

enum class WeightFormat : uint8_t {
  kF32,   // plain float32 rows
  kBF16,  // plain bfloat16 rows
};

struct WeightFormatInfo {
  WeightFormat format;
  std::string_view name;  // "f32", "bf16"
  DType storage;          // element type of the stored values
  int64_t block;          // values per block (1 for plain formats; 32 for a typical q-block)
  int64_t block_bytes;    // bytes per block, scales included
};

const WeightFormatInfo& weight_format_info(WeightFormat f);
std::string_view weight_format_name(WeightFormat f);

// The plain format whose values are stored as `t` (f32 -> kF32, bf16 -> kBF16); nullopt for
// dtypes that are not a weight format by themselves (quantized formats are detected from
// the checkpoint's quantization config, not from a dtype).
std::optional<WeightFormat> weight_format_for_dtype(DType t);

// Bytes of one row of `n_in` values; throws if n_in is not a multiple of the block.
size_t weight_row_bytes(WeightFormat f, int64_t n_in);

// Reference decode of one row to f32 (the scalar truth every kernel is tested against).
void dequantize_row(WeightFormat f, const void* row, int64_t n_in, float* out);

}  // namespace metrale
