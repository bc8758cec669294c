// CPU kernel throughput: linear as GEMV (decode: weight GB/s is the figure of merit, since
// decode is memory-bound) and as GEMM (prefill: GFLOP/s), paged decode attention, rms_norm.
// Threads: METRALE_THREADS or the physical core count (core/thread_pool.h).
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

ThreadPool& pool() {
  static ThreadPool p(default_thread_count());
  return p;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// args: n_out, n_in, rows, format (0 f32, 1 bf16)
void BM_Linear(benchmark::State& state) {
  const int64_t n_out = state.range(0), n_in = state.range(1), rows = state.range(2);
  const auto format = state.range(3) == 0 ? WeightFormat::kF32 : WeightFormat::kBF16;
  CpuBackend be(pool());
  const auto wf = random_floats(static_cast<size_t>(n_out * n_in), 1);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  const WeightTensor raw{
      .name = "w",
      .format = format,
      .n_out = n_out,
      .n_in = n_in,
      .data = format == WeightFormat::kF32 ? static_cast<const void*>(wf.data()) : wb.data()};
  const WeightTensor w = be.prepare(raw, PrepareMode::kCopy);  // huge-page-backed copy
  const auto x = random_floats(static_cast<size_t>(rows * n_in), 2);
  std::vector<float> y(static_cast<size_t>(rows * n_out));
  for (auto _ : state) {
    be.linear(rows_of(x.data(), rows, n_in), w, rows_of(y.data(), rows, n_out));
    benchmark::DoNotOptimize(y.data());
  }
  const double weight_bytes =
      static_cast<double>(weight_row_bytes(format, n_in)) * static_cast<double>(n_out);
  state.SetBytesProcessed(static_cast<int64_t>(weight_bytes) * state.iterations());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * n_out * n_in) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = pool().size();
}
BENCHMARK(BM_Linear)
    ->ArgNames({"out", "in", "rows", "bf16"})
    ->Args({3072, 1024, 1, 1})
    ->Args({1024, 3072, 1, 1})
    ->Args({3072, 1024, 1, 0})
    ->Args({4096, 4096, 1, 1})
    ->Args({4096, 4096, 4, 1})
    ->Args({3072, 1024, 128, 1})
    ->Args({1024, 1024, 512, 0})
    ->UseRealTime();

// args: context length, n_seqs
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t ctx = state.range(0), n_seqs = state.range(1);
  const int64_t n_heads = 16, n_kv = 4, hd = 128, page = 16;
  CpuBackend be(pool());
  const int64_t pages_per_seq = (ctx + page - 1) / page;
  const KvLayout layout{
      .n_pages = pages_per_seq * n_seqs, .page_size = page, .n_kv_heads = n_kv, .head_dim = hd};
  auto k = random_floats(static_cast<size_t>(layout.layer_elems()), 3);
  auto v = random_floats(k.size(), 4);
  std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(n_seqs));
  std::vector<KvPageTable> tables;
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int64_t p = 0; p < pages_per_seq; ++p)
      blocks[static_cast<size_t>(s)].push_back(static_cast<int32_t>(s * pages_per_seq + p));
  }
  for (int64_t s = 0; s < n_seqs; ++s) tables.push_back({blocks[static_cast<size_t>(s)], ctx});
  const auto q = random_floats(static_cast<size_t>(n_seqs * n_heads * hd), 5);
  std::vector<float> out(q.size());
  std::vector<int32_t> row_seq, pos;
  for (int64_t s = 0; s < n_seqs; ++s) {
    row_seq.push_back(static_cast<int32_t>(s));
    pos.push_back(static_cast<int32_t>(ctx - 1));
  }
  for (auto _ : state) {
    be.attention({.q = rows_of(q.data(), n_seqs, n_heads * hd),
                  .out = rows_of(out.data(), n_seqs, n_heads * hd),
                  .cache = {k.data(), v.data(), layout},
                  .seqs = tables,
                  .row_seq = row_seq,
                  .positions = pos,
                  .shape = {.n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd}});
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(2 * ctx * n_seqs * n_kv * hd * static_cast<int64_t>(sizeof(float)) *
                          state.iterations());
}
BENCHMARK(BM_AttentionDecode)
    ->ArgNames({"ctx", "seqs"})
    ->Args({512, 1})
    ->Args({4096, 1})
    ->Args({1024, 8})
    ->UseRealTime();

void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), n = 4096;
  CpuBackend be(pool());
  auto x = random_floats(static_cast<size_t>(rows * n), 6);
  auto h = random_floats(x.size(), 7);
  const auto w = random_floats(static_cast<size_t>(n), 8);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    be.rms_norm({.x = rows_of(x.data(), rows, n),
                 .residual = rows_of(h.data(), rows, n),
                 .out = rows_of(out.data(), rows, n),
                 .weight = w.data()});
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(rows * n * 4 * static_cast<int64_t>(sizeof(float)) * state.iterations());
}
BENCHMARK(BM_RmsNorm)->Arg(1)->Arg(256)->UseRealTime();

}  // namespace
}  // namespace metrale

BENCHMARK_MAIN();
