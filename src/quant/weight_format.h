#pragma once
// Weight formats: how one row of a [out, in] weight matrix is stored. This table is the one
// place that knows the byte layout of each format; backends look a format up here and pick
// a kernel per format, so a quantized layout arrives as one more row of the table plus its
// kernels, never as an if-chain in a layer.
//
// A quantized weight is its codes (n_out rows of weight_row_bytes(format, n_in) bytes) plus
// QuantParams: a grid of scales, optional zero points and an optional input-column order.
// Every checkpoint dialect (compressed-tensors, ModelOpt, the fp8 block-scaled layout) is
// normalised to these few formats at load (quant/quant_loader.h), so a kernel serves every
// producer that stores the same codes:
//
//   format   codes (per row)                               value of element k of row n
//   kInt4    two per byte, element 2i in the low nibble     (q - z) * s       q = nibble - 8
//            of byte i, stored as q + 8 (q in [-8, 7])
//   kInt8    one int8 per byte (q in [-128, 127])           (q - z) * s
//   kFp8     one float8_e4m3fn per byte                     e4m3(code) * s
//   kNvfp4   two e2m1 per byte, element 2i in the low       e2m1(nibble) * s
//            nibble of byte i
//
// where s = scale(n, group(k)) * scale_global computed in f32, z = zero(n, group(k)) (0 when
// the weight is symmetric), and group(k) = g_idx[k] when an input order is given (GPTQ's
// actorder), else k / group. The products are f32; dequantize_row below is the scalar truth
// every kernel is tested against.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/dtype.h"

namespace metrale {

enum class WeightFormat : uint8_t {
  kF32,    // plain float32 rows
  kBF16,   // plain bfloat16 rows
  kInt4,   // 4-bit integers with scales (and zero points) per group
  kInt8,   // 8-bit integers with scales (and zero points) per group
  kFp8,    // float8_e4m3fn with scales per group
  kNvfp4,  // e2m1 with an e4m3 (or wider) scale per 16 values and a global scale
};
inline constexpr int kWeightFormatCount = 6;

struct WeightFormatInfo {
  WeightFormat format;
  std::string_view name;  // "f32", "bf16", "int4", ...
  DType storage;          // element type of the stored codes (kU8 for packed nibbles)
  int64_t block;          // values per block of codes (2 for two nibbles per byte)
  int64_t block_bytes;    // bytes per block of codes (scales are in QuantParams)
  bool quantized;         // needs QuantParams
};

const WeightFormatInfo& weight_format_info(WeightFormat f);
std::string_view weight_format_name(WeightFormat f);
inline bool is_quantized(WeightFormat f) { return weight_format_info(f).quantized; }

// The plain format whose values are stored as `t` (f32 -> kF32, bf16 -> kBF16); nullopt for
// dtypes that are not a weight format by themselves (quantized formats are detected from
// the checkpoint's quantization config, not from a dtype).
std::optional<WeightFormat> weight_format_for_dtype(DType t);

// Bytes of one row of `n_in` codes; throws if n_in is not a multiple of the block.
size_t weight_row_bytes(WeightFormat f, int64_t n_in);

// The scales, zero points and input order of a quantized weight [n_out, n_in]. Scales and
// zero points are row-major grids [n_out, groups(n_in)], one entry per output row and group
// of `group` consecutive input columns (the last group may be shorter), or, with g_idx, per
// group id g_idx[k] in [0, groups). Pointers are not owned.
struct QuantParams {
  const void* scales = nullptr;     // [n_out, n_groups] of scale_dtype
  DType scale_dtype = DType::kF32;  // kF32, kBF16, kF16 or kF8E4M3
  float scale_global = 1.0f;        // multiplies every scale (NVFP4's second-level scale)
  int64_t group = 0;                // input columns per group (n_in for one scale per row)
  int64_t n_groups = 0;             // columns of the grids
  const int8_t* zeros = nullptr;    // [n_out, n_groups] zero points z, or null (symmetric)
  const int32_t* g_idx = nullptr;   // [n_in] group of each input column, or null
};

// Groups of a row of n_in values cut into runs of `group`: ceil(n_in / group).
inline int64_t quant_groups(int64_t n_in, int64_t group) { return (n_in + group - 1) / group; }

// Checks that `q` is complete and consistent for a weight of this format and shape (scale
// dtype allowed, groups, g_idx range when given); throws Error naming `name`.
void validate_quant_params(WeightFormat f, const QuantParams& q, int64_t n_out, int64_t n_in,
                           std::string_view name);

// Reference decode of row `row` (codes `row_codes`, n_in values) to f32: the scalar truth
// every kernel is tested against. `q` is ignored for plain formats.
void dequantize_row(WeightFormat f, const void* row_codes, const QuantParams& q, int64_t row,
                    int64_t n_in, float* out);
// The same for plain formats only (no parameters).
void dequantize_row(WeightFormat f, const void* row, int64_t n_in, float* out);

// Effective scale s = scale(row, g) * scale_global in f32.
float quant_scale(const QuantParams& q, int64_t row, int64_t g);

}  // namespace metrale
