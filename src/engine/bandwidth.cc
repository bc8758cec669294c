#include "engine/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/arena.h"
#include "core/thread_pool.h"

namespace metrale {

BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  constexpr size_t kStreams = 4;  // independent streams per thread hide load latency
  constexpr size_t kLine = 64 / sizeof(uint64_t);
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
      const size_t lines = e - b, per = lines / kStreams;
      uint64_t acc[kStreams][kLine] = {};
      for (size_t i = 0; i < per; ++i) {
        for (size_t s = 0; s < kStreams; ++s) {
          const uint64_t* p = data + (b + s * per + i) * kLine;
          for (size_t k = 0; k < kLine; ++k) acc[s][k] += p[k];
        }
      }
      uint64_t sum = 0;
      for (auto& a : acc) for (uint64_t v : a) sum += v;
      sinks[static_cast<size_t>(t) * 8] += sum;
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
