#pragma once
// LinearJob: one prepared weight bound to its input and output rows, runnable over any range
// of outputs on any thread. CpuBackend::linear runs one job; the MoE op runs one per active
// expert in a single parallel dispatch. The kernel is chosen from the weight's format and
// packing, so a new format is one more case here and in its kernel file.
#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/linear_pairs.h"
#include "backend/cpu/linear_quant.h"

namespace metrale::cpu {

// Output rows per unit of the linear work split: small enough to spread a decode GEMV over
// all threads, large enough to keep the 16-row weight tiles whole.
inline constexpr int64_t kLinearUnit = 16;

struct LinearJob {
  enum class Kind : uint8_t { kF32, kBf16, kBf16Packed, kBf16Pairs, kQuant };
  Kind kind = Kind::kF32;
  LinearTask task;  // f32-activation kernels
  PairsTask pairs;  // bf16-activation kernel (input rounded to bf16 by the caller)
  QuantTask quant;  // quantized weights (input gathered into packed order by the caller)
  int64_t n_out = 0;

  // Pieces of the output split are whole multiples of this many kLinearUnit units.
  int64_t unit_multiple() const { return kind == Kind::kBf16Pairs ? kPairsTileGroups : 1; }
  // Outputs [o_begin, o_end); o_begin a multiple of kLinearUnit.
  void run(int64_t o_begin, int64_t o_end) const;
};

// True when the weight's kernel reads its input as bf16 rows (round_rows_bf16 first).
inline bool reads_bf16_input(const WeightTensor& w) { return w.packing == kPackingBf16Pairs; }

// x: f32 rows; x_bf16: the same rows rounded to bf16, back to back (only when
// reads_bf16_input(w)); x_quant: the same rows as w's quantized kernel reads them,
// quant_input_bytes(w) each, back to back (only when that is not 0; prepare_quant_input, once
// per call).
LinearJob make_linear_job(ConstRows x, const uint16_t* x_bf16, const WeightTensor& w, Rows y,
                          const void* x_quant = nullptr);

}  // namespace metrale::cpu
