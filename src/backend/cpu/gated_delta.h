#pragma once
// Entry points of the CPU kernels of the Gated DeltaNet ops (cpu/gated_delta.cc): the causal
// conv, the gated delta rule (recurrent and chunked forms) and sigmoid_mul. Like kernels.h,
// each runs one thread's share of an op and dispatches to the best Highway target; CpuBackend
// (cpu/cpu_gated_delta.cc) splits the work, tests call them on every compiled target.
#include <cstddef>
#include <cstdint>
#include <limits>

#include "backend/backend.h"

namespace metrale::cpu {

// The rows of one sequence in a call: rows [row_begin, row_begin + run.out.size()).
struct StateSpan {
  int64_t row_begin = 0;
  const StateRun* run = nullptr;
  int64_t n_rows() const { return static_cast<int64_t>(run->out.size()); }
};

// --- causal conv ---
// Channels of one task (the last block of a row may be shorter).
inline constexpr int64_t kConvChannelBlock = 512;
// Scratch floats one causal_conv_block call needs: the starting state of its channels.
inline size_t causal_conv_scratch_floats(int64_t kernel) {
  return static_cast<size_t>((kernel - 1) * kConvChannelBlock);
}
// Channels [c_begin, c_end) (c_end - c_begin <= kConvChannelBlock) of every row of `span`.
void causal_conv_block(const CausalConvArgs& a, const StateSpan& span, int64_t c_begin,
                       int64_t c_end, float* scratch);

// --- gated delta rule ---
// The chunked form's chunk: rows [64 j, 64 (j + 1)) of a run form chunk j.
inline constexpr int64_t kDeltaChunk = 64;
// A run may take the chunked form when it has more than this many rows and keeps only its
// last state (every out but the last null); otherwise the recurrent form. On the CPU the
// chunked form does not pay: at Dk = Dv = 128 both forms cost about 4 Dk Dv FMAs per row and
// head (the chunked: 3 Dk Dv for its three state products plus the chunk's triangular
// products), and the recurrent one runs at the FMA bound with its state tile in L1, while the
// chunked one measured 1.3x slower at every run length (17 to 512 rows, 64- / 32- / 16-row
// chunks, Zen 4 AVX-512). So the backend never picks it; the kernel stays, tested against the
// recurrent form, as HF's prefill algorithm for a machine where it wins (set this to 16).
inline constexpr int64_t kDeltaChunkMinRows = std::numeric_limits<int64_t>::max();
// Rows whose normalised q / k the recurrent form prepares at once.
inline constexpr int64_t kDeltaRowBlock = 64;
bool delta_rule_chunked(const StateRun& run, int64_t min_rows = kDeltaChunkMinRows);
// Scratch floats one delta_rule_head call needs (chunked: whether any run takes that form).
size_t delta_rule_scratch_floats(const DeltaRuleArgs& a, bool chunked);
// Value head `head` of every row of `span`: reads run.in, writes out rows and run.out blocks;
// the chunked form when delta_rule_chunked(run, chunk_min_rows).
void delta_rule_head(const DeltaRuleArgs& a, const StateSpan& span, int64_t head, float* scratch,
                     int64_t chunk_min_rows = kDeltaChunkMinRows);
// The same in a given form (tests compare the two; chunked requires only the last out set).
void delta_rule_head_recurrent(const DeltaRuleArgs& a, const StateSpan& span, int64_t head,
                               float* scratch);
void delta_rule_head_chunked(const DeltaRuleArgs& a, const StateSpan& span, int64_t head,
                             float* scratch);

// --- sigmoid_mul ---
void sigmoid_mul_rows(const SigmoidMulArgs& a, int64_t r_begin, int64_t r_end);

}  // namespace metrale::cpu
