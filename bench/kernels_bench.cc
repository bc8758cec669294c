// CPU kernel throughput: linear as GEMV (decode: weight GB/s is the figure of merit, since
// decode is memory-bound) and as GEMM (prefill: GFLOP/s), for plain and quantized weights and
// the bf16-compute kernel, paged decode attention, rms_norm.
// Threads: METRALE_THREADS or the physical core count (core/thread_pool.h).
#include <benchmark/benchmark.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear_quant.h"
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

// Copies of a weight of `bytes` for a cold run: enough that cycling through them reads every
// call's weights from DRAM (well past the last-level cache), as a decode step reads a model's
// layers; 1 for a hot run (the weight stays in cache between calls).
int64_t copies_for(bool cold, double bytes) {
  constexpr double kColdBytes = 256.0 * (1 << 20);
  return cold ? std::max<int64_t>(2, static_cast<int64_t>(std::ceil(kColdBytes / bytes))) : 1;
}

// The timed loop of a linear benchmark: `copies` huge-page-backed copies of `raw` (copies_for),
// each call on the next, over `rows` rows of random input.
void time_linear(benchmark::State& state, CpuBackend& be, const WeightTensor& raw, int64_t copies,
                 int64_t rows) {
  const int64_t n_out = raw.n_out, n_in = raw.n_in;
  std::vector<WeightTensor> w;
  for (int64_t i = 0; i < copies; ++i) w.push_back(be.prepare(raw, PrepareMode::kCopy));
  const auto x = random_floats(static_cast<size_t>(rows * n_in), 2);
  std::vector<float> y(static_cast<size_t>(rows * n_out));
  size_t next = 0;
  for (auto _ : state) {
    be.linear(rows_of(x.data(), rows, n_in), w[next], rows_of(y.data(), rows, n_out));
    next = next + 1 == w.size() ? 0 : next + 1;
    benchmark::DoNotOptimize(y.data());
  }
}

// args: n_out, n_in, rows, format (0 f32, 1 bf16), cold (weights from DRAM, copies_for)
void BM_Linear(benchmark::State& state) {
  const int64_t n_out = state.range(0), n_in = state.range(1), rows = state.range(2);
  const auto format = state.range(3) == 0 ? WeightFormat::kF32 : WeightFormat::kBF16;
  const double weight_bytes =
      static_cast<double>(weight_row_bytes(format, n_in)) * static_cast<double>(n_out);
  const int64_t copies = copies_for(state.range(4) != 0, weight_bytes);
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
  time_linear(state, be, raw, copies, rows);
  state.SetBytesProcessed(static_cast<int64_t>(weight_bytes) * state.iterations());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * n_out * n_in) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = pool().size();
}
BENCHMARK(BM_Linear)
    ->ArgNames({"out", "in", "rows", "bf16", "cold"})
    ->Args({3072, 1024, 1, 1, 0})
    ->Args({1024, 3072, 1, 1, 0})
    ->Args({3072, 1024, 1, 1, 1})
    ->Args({1024, 3072, 1, 1, 1})
    ->Args({3072, 1024, 1, 0, 0})
    ->Args({4096, 4096, 1, 1, 0})
    ->Args({4096, 4096, 4, 1, 0})
    ->Args({3072, 1024, 128, 1, 0})
    ->Args({3072, 1024, 64, 1, 0})
    ->Args({1024, 3072, 64, 1, 0})
    ->Args({1024, 1024, 512, 0, 0})
    ->UseRealTime();

// The bf16-compute kernel (Compute::kBF16, backend/cpu/linear_pairs.h) at prefill sizes:
// Qwen3-0.6B's four linears (q|k|v, o, gate|up, down) on a step of `rows` rows, the weights
// cold (from DRAM, as every linear of a prefill step reads them: a 0.6B model's 880 MB of
// weights pass through the caches once per step) or hot.
// args: n_out, n_in, rows, cold
void BM_LinearBf16Compute(benchmark::State& state) {
  const int64_t n_out = state.range(0), n_in = state.range(1), rows = state.range(2);
  const double weight_bytes = 2.0 * static_cast<double>(n_out * n_in);
  const int64_t copies = copies_for(state.range(3) != 0, weight_bytes);
  CpuBackend be(pool(), Compute::kBF16);
  const auto wf = random_floats(static_cast<size_t>(n_out * n_in), 1);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  const WeightTensor raw{
      .name = "w", .format = WeightFormat::kBF16, .n_out = n_out, .n_in = n_in, .data = wb.data()};
  time_linear(state, be, raw, copies, rows);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * n_out * n_in) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = pool().size();
}
BENCHMARK(BM_LinearBf16Compute)
    ->ArgNames({"out", "in", "rows", "cold"})
    ->ArgsProduct({{4096}, {1024}, {128, 512}, {0, 1}})
    ->ArgsProduct({{1024}, {2048}, {128, 512}, {1}})
    ->ArgsProduct({{6144}, {1024}, {128, 512}, {1}})
    ->ArgsProduct({{1024}, {3072}, {128, 512}, {0, 1}})
    ->UseRealTime();

#if defined(__x86_64__)
// The ceiling BM_LinearBf16Compute is measured against: one thread issuing vdpbf16ps alone into
// 24 independent accumulators (nothing loaded, no dependency a core must wait on), 64 FLOP
// each. On Zen 5: 2 per cycle. (Its rate counter divides by CPU time, so a shared machine
// does not lower it.)
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // g++ 12's AVX-512 headers (linear_packed.cc)
#endif
__attribute__((target("avx512f,avx512bf16"))) double dot_bf16_peak_loop(int64_t iters) {
  __m512 acc[24];
  for (__m512& c : acc) c = _mm512_setzero_ps();
  __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3F803F80));
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x00010001));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (__m512& c : acc) c = _mm512_dpbf16_ps(c, a, b);
    __asm__ volatile("" : "+v"(a));  // keeps the loop from being folded
  }
  float sum = 0.0f;
  for (const __m512& c : acc) sum += _mm512_reduce_add_ps(c);
  return sum;
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

void BM_DotBf16Peak(benchmark::State& state) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) {
    state.SkipWithError("this CPU has no AVX512_BF16");
    return;
  }
  constexpr int64_t kIters = 1 << 20;
  for (auto _ : state) benchmark::DoNotOptimize(dot_bf16_peak_loop(kIters));
  state.counters["GFLOP/s"] =
      benchmark::Counter(64.0 * 24 * kIters * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DotBf16Peak);
#endif

// The quantized layouts of common checkpoints (compressed-tensors W4A16 / W8A16 / FP8,
// ModelOpt NVFP4), with bf16 scales except NVFP4's e4m3.
struct QuantVariant {
  const char* name;
  WeightFormat format;
  int64_t group;  // 0: per channel
  bool asym;
  DType scale_dtype;
};
constexpr QuantVariant kQuantVariants[] = {
    {"int4 g128", WeightFormat::kInt4, 128, false, DType::kBF16},
    {"int4 g128 asym", WeightFormat::kInt4, 128, true, DType::kBF16},
    {"int8 channel", WeightFormat::kInt8, 0, false, DType::kBF16},
    {"fp8 channel", WeightFormat::kFp8, 0, false, DType::kBF16},
    {"nvfp4", WeightFormat::kNvfp4, 16, false, DType::kF8E4M3},
};

// args: n_out, n_in, rows, variant (kQuantVariants), cold (as BM_Linear), int8 (1:
// Compute::kInt8, the q8 layouts with int8 activations, which fp8 does not have). Bytes: the
// packed weight the kernel streams (codes, scales, zero points).
void BM_QuantLinear(benchmark::State& state) {
  const int64_t n_out = state.range(0), n_in = state.range(1), rows = state.range(2);
  const QuantVariant& v = kQuantVariants[state.range(3)];
  CpuBackend be(pool(), state.range(5) != 0 ? Compute::kInt8 : Compute::kF32);
  std::mt19937 rng(1);
  std::vector<uint8_t> codes(weight_row_bytes(v.format, n_in) * static_cast<size_t>(n_out));
  for (uint8_t& b : codes) {
    b = static_cast<uint8_t>(rng());
    if (v.format == WeightFormat::kFp8 && (b & 0x7F) == 0x7F) b ^= 1;  // no NaN
  }
  const int64_t group = v.group > 0 ? v.group : n_in;
  const int64_t n_groups = quant_groups(n_in, group);
  const auto scale_values = random_floats(static_cast<size_t>(n_out * n_groups), 3);
  std::vector<uint16_t> scales16;
  std::vector<uint8_t> scales8;
  for (float s : scale_values) {
    scales16.push_back(f32_to_bf16(0.01f * s));
    scales8.push_back(f32_to_f8e4m3(100.0f * s));
  }
  std::vector<int8_t> zeros(scale_values.size());
  for (int8_t& z : zeros) z = static_cast<int8_t>(static_cast<int>(rng() % 16) - 8);
  const WeightTensor raw{
      .name = "w",
      .format = v.format,
      .n_out = n_out,
      .n_in = n_in,
      .data = codes.data(),
      .quant = {.scales = v.scale_dtype == DType::kF8E4M3 ? static_cast<const void*>(scales8.data())
                                                          : scales16.data(),
                .scale_dtype = v.scale_dtype,
                .scale_global = v.scale_dtype == DType::kF8E4M3 ? 1e-3f : 1.0f,
                .group = group,
                .n_groups = n_groups,
                .zeros = v.asym ? zeros.data() : nullptr}};
  std::vector<WeightTensor> w = {be.prepare(raw, PrepareMode::kCopy)};
  const int64_t tiles = (n_out + cpu::kQuantRows - 1) / cpu::kQuantRows;
  const int64_t bytes = tiles * cpu::quant_layout(w[0]).tile_bytes;
  const int64_t copies = copies_for(state.range(4) != 0, static_cast<double>(bytes));
  for (int64_t i = 1; i < copies; ++i) w.push_back(be.prepare(raw, PrepareMode::kCopy));
  const auto x = random_floats(static_cast<size_t>(rows * n_in), 2);
  std::vector<float> y(static_cast<size_t>(rows * n_out));
  size_t next = 0;
  for (auto _ : state) {
    be.linear(rows_of(x.data(), rows, n_in), w[next], rows_of(y.data(), rows, n_out));
    next = next + 1 == w.size() ? 0 : next + 1;
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(bytes * state.iterations());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * n_out * n_in) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = pool().size();
  state.SetLabel(v.name);
}
// Qwen3-0.6B's MLP shapes: decode (1 row, hot and cold) and a prefill chunk (64 rows).
void QuantShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"out", "in", "rows", "variant", "cold", "int8"});
  for (auto [rows, cold] : {std::pair<int64_t, int64_t>{1, 0}, {1, 1}, {64, 0}}) {
    for (auto [n_out, n_in] : {std::pair<int64_t, int64_t>{3072, 1024}, {1024, 3072}}) {
      for (int64_t v = 0; v < static_cast<int64_t>(std::size(kQuantVariants)); ++v) {
        for (int64_t int8 : {0, 1}) {
          if (int8 == 1 && kQuantVariants[v].format == WeightFormat::kFp8) continue;
          b->Args({n_out, n_in, rows, v, cold, int8});
        }
      }
    }
  }
}
BENCHMARK(BM_QuantLinear)->Apply(QuantShapes)->UseRealTime();

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

// LoRA (Backend::lora) beside the base linear it rides on: `rows` rows, each routed to one of
// `distinct` adapters (row r to slot r % distinct) of rank 16 in a pool of 16 bf16 slots, for
// one [out, in] projection. Bytes: the adapters' A and B^T the call reads.
// args: n_out, n_in, rows, distinct
void BM_Lora(benchmark::State& state) {
  const int64_t n_out = state.range(0), n_in = state.range(1), rows = state.range(2);
  const int64_t distinct = state.range(3), slots = 16, R = 16;
  CpuBackend be(pool());
  const auto af = random_floats(static_cast<size_t>(slots * R * n_in), 1);
  const auto bf = random_floats(static_cast<size_t>(slots * R * n_out), 2);
  std::vector<uint16_t> a(af.size()), b(bf.size());
  for (size_t i = 0; i < af.size(); ++i) a[i] = f32_to_bf16(af[i]);
  for (size_t i = 0; i < bf.size(); ++i) b[i] = f32_to_bf16(bf[i]);
  const std::vector<int32_t> rank(static_cast<size_t>(slots), static_cast<int32_t>(R));
  const std::vector<float> scale(static_cast<size_t>(slots), 1.0f);
  const LoraWeights w{.a = a.data(),
                      .b = b.data(),
                      .dtype = DType::kBF16,
                      .n_slots = slots,
                      .max_rank = R,
                      .n_in = n_in,
                      .n_out = n_out,
                      .rank = rank.data(),
                      .scale = scale.data()};
  std::vector<int32_t> row_slots(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    row_slots[static_cast<size_t>(r)] = static_cast<int32_t>(r % distinct);
  const auto x = random_floats(static_cast<size_t>(rows * n_in), 3);
  std::vector<float> y(static_cast<size_t>(rows * n_out));
  for (auto _ : state) {
    be.lora({.x = rows_of(x.data(), rows, n_in),
             .y = rows_of(y.data(), rows, n_out),
             .slots = row_slots,
             .weights = &w});
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(std::min(distinct, rows) * R * (n_in + n_out) * 2) *
                          state.iterations());
  state.counters["threads"] = pool().size();
}
BENCHMARK(BM_Lora)
    ->ArgNames({"out", "in", "rows", "distinct"})
    ->Args({3072, 1024, 16, 1})
    ->Args({3072, 1024, 16, 16})
    ->Args({1024, 3072, 16, 16})
    ->Args({2048, 1024, 1, 1})
    ->UseRealTime();

}  // namespace
}  // namespace metrale

BENCHMARK_MAIN();
