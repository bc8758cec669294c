// CpuBackend's Gated DeltaNet ops: causal_conv, delta_rule, sigmoid_mul. The public Backend
// ops validated the arguments (backend.cc); these cut the work into tasks that never share an
// output (a sequence's channel block, a sequence's value head, a row) and claim them on the
// pool. A task's arithmetic is fixed by the kernel (cpu/gated_delta.cc), so results do not
// depend on the thread count or on which other sequences share the call.
#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gated_delta.h"
#include "core/thread_pool.h"

namespace metrale {

int64_t CpuBackend::state_spans(std::span<const int32_t> row_seq, const StateSlice& state) {
  const auto n = static_cast<int64_t>(row_seq.size());
  if (state_spans_.size() < row_seq.size()) state_spans_.resize(row_seq.size());
  int64_t count = 0;
  for (int64_t r = 0; r < n;) {
    const StateRun& run = state.runs[static_cast<size_t>(row_seq[static_cast<size_t>(r)])];
    state_spans_[static_cast<size_t>(count++)] = {.row_begin = r, .run = &run};
    r += static_cast<int64_t>(run.out.size());  // validated: the sequence's rows are consecutive
  }
  return count;
}

float* CpuBackend::thread_scratch(size_t floats_per_thread) {
  constexpr size_t kAlign = 16;  // floats: 64 bytes
  const size_t need = floats_per_thread * static_cast<size_t>(pool_->size()) + kAlign;
  if (thread_scratch_.size() < need) thread_scratch_.resize(need);
  const auto addr = reinterpret_cast<uintptr_t>(thread_scratch_.data());
  return thread_scratch_.data() + (kAlign - addr / sizeof(float) % kAlign) % kAlign;
}

void CpuBackend::do_causal_conv(const CausalConvArgs& a) {
  const int64_t n_spans = state_spans(a.row_seq, a.state);
  const int64_t channels = a.x.n_cols;
  const int64_t blocks = (channels + cpu::kConvChannelBlock - 1) / cpu::kConvChannelBlock;
  const size_t per_thread = (cpu::causal_conv_scratch_floats(a.kernel) + 15) / 16 * 16;
  float* scratch = thread_scratch(per_thread);
  pool_->parallel_for_dynamic(
      static_cast<size_t>(n_spans * blocks), 1, [&](size_t b, size_t e, int t) {
        for (auto task = static_cast<int64_t>(b); task < static_cast<int64_t>(e); ++task) {
          const int64_t c0 = task % blocks * cpu::kConvChannelBlock;
          cpu::causal_conv_block(a, state_spans_[static_cast<size_t>(task / blocks)], c0,
                                 std::min(channels, c0 + cpu::kConvChannelBlock),
                                 scratch + static_cast<size_t>(t) * per_thread);
        }
      });
}

void CpuBackend::do_delta_rule(const DeltaRuleArgs& a) {
  const int64_t n_spans = state_spans(a.row_seq, a.state);
  bool chunked = false;
  for (int64_t s = 0; s < n_spans; ++s)
    chunked = chunked || cpu::delta_rule_chunked(*state_spans_[static_cast<size_t>(s)].run,
                                                 delta_chunk_min_rows_);
  const size_t per_thread = (cpu::delta_rule_scratch_floats(a, chunked) + 15) / 16 * 16;
  float* scratch = thread_scratch(per_thread);
  const int64_t heads = a.n_v_heads;
  pool_->parallel_for_dynamic(
      static_cast<size_t>(n_spans * heads), 1, [&](size_t b, size_t e, int t) {
        for (auto task = static_cast<int64_t>(b); task < static_cast<int64_t>(e); ++task) {
          cpu::delta_rule_head(a, state_spans_[static_cast<size_t>(task / heads)], task % heads,
                               scratch + static_cast<size_t>(t) * per_thread,
                               delta_chunk_min_rows_);
        }
      });
}

void CpuBackend::do_sigmoid_mul(const SigmoidMulArgs& a) {
  pool_->parallel_for(static_cast<size_t>(a.y.n_rows), [&](size_t b, size_t e, int) {
    cpu::sigmoid_mul_rows(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

}  // namespace metrale
