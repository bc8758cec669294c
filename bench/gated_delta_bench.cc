// Gated DeltaNet kernels at Qwen3-Next's shape (16 key heads, 32 value heads, head dims 128,
// conv over 8192 channels, kernel 4): delta_rule decode (one row per sequence, state updated
// in place: the figure of merit is state GB/s, read + written) and a 512-row prefill in the
// chunked and the recurrent form; causal_conv decode and prefill. Threads: the `threads` arg.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gated_delta.h"
#include "core/aligned_buffer.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

constexpr int64_t kHk = 16, kHv = 32, kDk = 128, kDv = 128;
constexpr int64_t kConvChannels = 2 * kHk * kDk + kHv * kDv, kConvKernel = 4;

ThreadPool& pool(int64_t threads) {
  static std::unique_ptr<ThreadPool> pools[3];
  if (!pools[threads]) pools[threads] = std::make_unique<ThreadPool>(static_cast<int>(threads));
  return *pools[threads];
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Inputs of `rows` rows over `seqs` sequences (rows split evenly). The states of `layers`
// layers (one block per sequence and layer) are laid out so that a decode loop can rotate
// through more state than the last-level cache holds, as a model's layers do.
struct DeltaSetup {
  int64_t rows, seqs, layers;
  std::vector<float> q, k, v, a, b, a_log, dt_bias, out;
  AlignedBuffer blocks;
  std::vector<int32_t> row_seq;
  std::vector<std::vector<std::byte*>> outs;  // [layer * seqs + s]
  std::vector<std::vector<StateRun>> runs;    // [layer][s]
  DeltaSetup(int64_t n_rows, int64_t n_seqs, bool keep_all, int64_t n_layers = 1)
      : rows(n_rows),
        seqs(n_seqs),
        layers(n_layers),
        q(random_floats(static_cast<size_t>(rows * kHk * kDk), 1)),
        k(random_floats(static_cast<size_t>(rows * kHk * kDk), 2)),
        v(random_floats(static_cast<size_t>(rows * kHv * kDv), 3)),
        a(random_floats(static_cast<size_t>(rows * kHv), 4)),
        b(random_floats(static_cast<size_t>(rows * kHv), 5)),
        a_log(random_floats(static_cast<size_t>(kHv), 6, -2.0f, 1.0f)),
        dt_bias(random_floats(static_cast<size_t>(kHv), 7)),
        out(static_cast<size_t>(rows * kHv * kDv)),
        blocks(static_cast<size_t>(seqs * layers) * state_bytes()) {
    const int64_t per = rows / seqs;
    for (int64_t s = 0; s < seqs; ++s)
      for (int64_t i = 0; i < per; ++i) row_seq.push_back(static_cast<int32_t>(s));
    outs.resize(static_cast<size_t>(seqs * layers));
    runs.resize(static_cast<size_t>(layers));
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t s = 0; s < seqs; ++s) {
        std::byte* blk = blocks.as<std::byte>() + static_cast<size_t>(l * seqs + s) * state_bytes();
        auto& o = outs[static_cast<size_t>(l * seqs + s)];
        for (int64_t i = 0; i < per; ++i) o.push_back(keep_all || i == per - 1 ? blk : nullptr);
        runs[static_cast<size_t>(l)].push_back({.in = blk, .out = o});
      }
    }
  }
  static size_t state_bytes() { return static_cast<size_t>(kHv * kDk * kDv) * sizeof(float); }
  DeltaRuleArgs args(int64_t layer = 0) {
    return {.q = rows_of(q.data(), rows, kHk * kDk),
            .k = rows_of(k.data(), rows, kHk * kDk),
            .v = rows_of(v.data(), rows, kHv * kDv),
            .a = rows_of(a.data(), rows, kHv),
            .b = rows_of(b.data(), rows, kHv),
            .a_log = a_log.data(),
            .dt_bias = dt_bias.data(),
            .n_k_heads = kHk,
            .n_v_heads = kHv,
            .k_head_dim = kDk,
            .v_head_dim = kDv,
            .out = rows_of(out.data(), rows, kHv * kDv),
            .row_seq = row_seq,
            .state = {.runs = runs[static_cast<size_t>(layer)], .offset = 0, .dtype = DType::kF32}};
  }
};

// args: batch (sequences, one row each, state updated in place), threads. Each iteration is
// the next of enough layers' states (>= 128 MiB) that every state comes from DRAM.
void BM_DeltaRuleDecode(benchmark::State& state) {
  const int64_t batch = state.range(0);
  ThreadPool& p = pool(state.range(1));
  CpuBackend be(p);
  const auto per_layer = static_cast<int64_t>(DeltaSetup::state_bytes()) * batch;
  const int64_t layers = std::max<int64_t>(2, (int64_t{128} << 20) / per_layer);
  DeltaSetup s(batch, batch, true, layers);
  int64_t layer = 0;
  for (auto _ : state) {
    be.delta_rule(s.args(layer));
    layer = (layer + 1) % layers;
    benchmark::DoNotOptimize(s.out.data());
  }
  // Each sequence's state is read once and written once.
  state.SetBytesProcessed(static_cast<int64_t>(2 * DeltaSetup::state_bytes()) * batch *
                          state.iterations());
}
BENCHMARK(BM_DeltaRuleDecode)
    ->ArgNames({"batch", "threads"})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({16, 1})
    ->Args({16, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// args: rows (one sequence, only the last state kept), form (0 chunked, 1 recurrent), threads
void BM_DeltaRulePrefill(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const bool recurrent = state.range(1) == 1;
  ThreadPool& p = pool(state.range(2));
  DeltaSetup s(rows, 1, false);
  const DeltaRuleArgs a = s.args();
  const size_t per_thread = (cpu::delta_rule_scratch_floats(a, true) + 15) / 16 * 16;
  std::vector<float> scratch(per_thread * static_cast<size_t>(p.size()));
  const cpu::StateSpan span{.row_begin = 0, .run = &s.runs[0][0]};
  for (auto _ : state) {
    p.parallel_for_dynamic(static_cast<size_t>(kHv), 1, [&](size_t b, size_t e, int t) {
      for (size_t h = b; h < e; ++h) {
        float* sc = scratch.data() + static_cast<size_t>(t) * per_thread;
        if (recurrent) {
          cpu::delta_rule_head_recurrent(a, span, static_cast<int64_t>(h), sc);
        } else {
          cpu::delta_rule_head_chunked(a, span, static_cast<int64_t>(h), sc);
        }
      }
    });
    benchmark::DoNotOptimize(s.out.data());
  }
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DeltaRulePrefill)
    ->ArgNames({"rows", "recurrent", "threads"})
    ->ArgsProduct({{17, 32, 64, 512}, {0, 1}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// args: rows per sequence, sequences, threads
void BM_CausalConv(benchmark::State& state) {
  const int64_t per = state.range(0), seqs = state.range(1), rows = per * seqs;
  ThreadPool& p = pool(state.range(2));
  CpuBackend be(p);
  const auto x = random_floats(static_cast<size_t>(rows * kConvChannels), 8);
  const auto w = random_floats(static_cast<size_t>(kConvKernel * kConvChannels), 9);
  std::vector<float> out(x.size());
  const size_t block_bytes = static_cast<size_t>((kConvKernel - 1) * kConvChannels) * 4;
  AlignedBuffer blocks(static_cast<size_t>(seqs) * block_bytes);
  std::vector<int32_t> row_seq;
  std::vector<std::vector<std::byte*>> outs(static_cast<size_t>(seqs));
  std::vector<StateRun> runs;
  for (int64_t s = 0; s < seqs; ++s) {
    std::byte* blk = blocks.as<std::byte>() + static_cast<size_t>(s) * block_bytes;
    for (int64_t i = 0; i < per; ++i) {
      row_seq.push_back(static_cast<int32_t>(s));
      outs[static_cast<size_t>(s)].push_back(i == per - 1 ? blk : nullptr);
    }
    runs.push_back({.in = blk, .out = outs[static_cast<size_t>(s)]});
  }
  const CausalConvArgs a{.x = rows_of(x.data(), rows, kConvChannels),
                         .out = rows_of(out.data(), rows, kConvChannels),
                         .weight = w.data(),
                         .kernel = kConvKernel,
                         .row_seq = row_seq,
                         .state = {.runs = runs, .dtype = DType::kF32}};
  for (auto _ : state) {
    be.causal_conv(a);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CausalConv)
    ->ArgNames({"rows", "seqs", "threads"})
    ->Args({1, 1, 1})
    ->Args({1, 16, 1})
    ->Args({512, 1, 1})
    ->Args({512, 1, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace metrale

BENCHMARK_MAIN();
