#pragma once
// Reads one quantized linear module from a checkpoint, in whichever producer's layout its
// tensors are, and normalises it to a WeightFormat + QuantParams (quant/weight_format.h) with
// owned arrays. The layouts (tests/data/fixtures/README.md documents each byte):
//
//   tensors of module P                                    layout                       format
//   P.weight_packed I32 [N, K*b/32], P.weight_scale [N, G]  compressed-tensors           int4/int8
//     (+ P.weight_zero_point I32 [ceil(N*b/32), G], packed   pack-quantized: b-bit codes
//     along N; + P.weight_g_idx [K]; P.weight_shape [2])    + 2^(b-1), packed LSB first
//   P.weight I8 [N, K], P.weight_scale [N, 1] | [1]         compressed-tensors int-q.    int8
//   P.weight_packed U8 [N, K/2], P.weight_scale E4M3        compressed-tensors nvfp4     nvfp4
//     [N, K/16], P.weight_global_scale F32 [1]               (value = q * s / global)
//   P.weight U8 [N, K/2], P.weight_scale E4M3 [N, K/16],    ModelOpt NVFP4               nvfp4
//     P.weight_scale_2 F32 []                                (value = q * s * scale_2)
//   P.weight E4M3 [N, K], P.weight_scale [] | [1] | [N, 1]  compressed-tensors float-q., fp8
//     | [N] | [N/bn, K/bk] | [N, G]                         ModelOpt FP8 (tensor, channel,
//                                                            block, group scales)
//   P.weight E4M3 [N, K], P.weight_scale_inv [ceil(N/bn),   fp8 block-scaled (DeepSeek-  fp8
//     ceil(K/bk)]                                            V3): value = q * scale_inv
//
// Static activation scales (input_scale, input_global_scale) are recognised and not used:
// activations stay f32 on this backend (weight-only compute). Every shape, dtype and value
// that could make a wrong answer is checked; errors name the tensor and the expected form.
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors/checkpoint.h"
#include "quant/quant_config.h"
#include "quant/weight_format.h"

namespace metrale {

struct QuantizedWeight {
  WeightFormat format = WeightFormat::kInt4;
  int64_t n_out = 0, n_in = 0;
  std::vector<uint8_t> codes;   // n_out rows of weight_row_bytes(format, n_in)
  std::vector<uint8_t> scales;  // [n_out, n_groups] of scale_dtype
  DType scale_dtype = DType::kF32;
  float scale_global = 1.0f;
  int64_t group = 0, n_groups = 0;
  std::vector<int8_t> zeros;         // [n_out, n_groups] or empty
  std::vector<int32_t> g_idx;        // [n_in] or empty
  std::string grid;                  // scale grid as stored: "tensor", "channel", "group 128",
                                     // "block 128x128"
  std::string layout;                // "compressed-tensors pack-quantized", "ModelOpt NVFP4", ...
  std::vector<std::string> tensors;  // every tensor of the module it read (to claim)

  QuantParams params() const;
  // "int4 group 128 asym actorder (bf16 scales)" (for inspect and messages).
  std::string describe() const;
};

// True when module `prefix` holds the tensors of a quantized layout (any of the above).
bool has_quantized_tensors(const Checkpoint& checkpoint, const std::string& prefix);

// Reads module `prefix` ([n_out, n_in]) and checks it against the declared `scheme` (kAny:
// whatever the tensors hold). Throws an Error naming the tensor on any mismatch.
QuantizedWeight read_quantized(const Checkpoint& checkpoint, const std::string& prefix,
                               const ModuleScheme& scheme, int64_t n_out, int64_t n_in);

// Rows of several parts back to back (q|k|v, gate|up) as one weight, when their parameters
// allow one grid: same format, group and input order. Scale dtypes or global scales that
// differ are widened to f32 with the global folded in. Throws when they cannot be joined.
bool can_join(const std::vector<const QuantizedWeight*>& parts);
QuantizedWeight join_quantized(std::vector<QuantizedWeight> parts, const std::string& name);

}  // namespace metrale
