#include "engine/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/arena.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

constexpr size_t kStreams = 4;  // independent streams per thread hide load latency
constexpr size_t kLine = 64 / sizeof(uint64_t);

// Sums `per` cache lines from each of kStreams sub-ranges starting at `lines` (which are
// `per` lines apart). Cloned per ISA so the loads are full-width wherever the CPU allows;
// a baseline-x86 loop is add-bound and under-reports the bandwidth.
__attribute__((target_clones("avx512f", "avx2", "default"))) uint64_t sum_streams(const uint64_t* lines,
                                                                                size_t per) {
  uint64_t acc[kStreams][kLine] = {};
  for (size_t i = 0; i < per; ++i) {
    for (size_t s = 0; s < kStreams; ++s) {
      const uint64_t* p = lines + (s * per + i) * kLine;
      for (size_t k = 0; k < kLine; ++k) acc[s][k] += p[k];
    }
  }
  uint64_t sum = 0;
  for (auto& a : acc) {
    for (uint64_t v : a) sum += v;
  }
  return sum;
}

}  // namespace

BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  const size_t n = bytes / sizeof(uint64_t) / (kStreams * kLine) * (kStreams * kLine);
  AlignedBuffer buffer(n * sizeof(uint64_t));
  auto* data = buffer.as<uint64_t>();
  // Touch every page first (and from the threads that will read it).
  pool.parallel_for(n, [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i) data[i] = i;
  });
  std::vector<uint64_t> sinks(static_cast<size_t>(pool.size()) * 8);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    // Each thread reads its slice as kStreams interleaved sub-ranges, 8 words a step.
    pool.parallel_for(n / kLine, [&](size_t b, size_t e, int t) {
      sinks[static_cast<size_t>(t) * 8] += sum_streams(data + b * kLine, (e - b) / kStreams);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
  }
  // Keep the sums observable so the reads are not optimised away.
  volatile uint64_t keep = 0;
  for (uint64_t v : sinks) keep = keep + v;
  (void)keep;
  return {best, n * sizeof(uint64_t)};
}

}  // namespace metrale
