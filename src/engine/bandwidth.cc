#include "engine/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

// An anonymous buffer advised for (or against) transparent huge pages, filled with non-zero
// bytes by the threads that will read it (so no read hits the shared zero page).
class ProbeBuffer {
 public:
  ProbeBuffer(ThreadPool& pool, size_t bytes, bool huge)
      : memory_(bytes, huge ? PageAdvice::kHuge : PageAdvice::kSmall) {
    char* data = memory_.as<char>();
    pool.parallel_for(bytes / bandwidth_detail::kLine, [&](size_t b, size_t e, int) {
      std::memset(data + b * bandwidth_detail::kLine, 1, (e - b) * bandwidth_detail::kLine);
    });
  }
  const char* data() const { return memory_.as<const char>(); }

 private:
  AlignedBuffer memory_;
};

}  // namespace

BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  const auto n_threads = static_cast<size_t>(pool.size());
  // Whole lines per thread, so every slice starts 64-byte aligned.
  const size_t per_thread = bytes / n_threads / bandwidth_detail::kLine * bandwidth_detail::kLine;
  const std::vector<ReadStrategy> grid = read_strategy_grid();
  std::vector<uint64_t> sinks(n_threads * 8);  // a line apart: no false sharing
  std::vector<size_t> read(n_threads * 8);
  BandwidthResult best{0, per_thread * n_threads, ""};
  for (bool huge : {true, false}) {
    ProbeBuffer buffer(pool, per_thread * n_threads, huge);
    for (const ReadStrategy& s : grid) {
      if (s.huge_pages != huge) continue;
      for (int r = 0; r < reps + 1; ++r) {  // the first pass settles pages and frequencies
        std::fill(read.begin(), read.end(), 0);
        const auto t0 = std::chrono::steady_clock::now();
        if (s.chunk_bytes != 0) {  // threads claim chunks, as the linear kernels' pieces
          const size_t chunk = s.chunk_bytes / bandwidth_detail::kLine * bandwidth_detail::kLine;
          pool.parallel_for_dynamic(
              per_thread * n_threads / chunk, 1, [&](size_t b, size_t e, int t) {
                const auto i = static_cast<size_t>(t);
                for (size_t c = b; c < e; ++c) {
                  sinks[i * 8] += read_slice(buffer.data() + c * chunk, chunk, s, &read[i * 8]);
                }
              });
        } else {
          pool.parallel_for(n_threads, [&](size_t b, size_t e, int) {
            for (size_t t = b; t < e; ++t) {
              sinks[t * 8] +=
                  read_slice(buffer.data() + t * per_thread, per_thread, s, &read[t * 8]);
            }
          });
        }
        const double sec =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        size_t total = 0;
        for (size_t t = 0; t < n_threads; ++t) total += read[t * 8];
        const double gbs = static_cast<double>(total) / sec / 1e9;
        if (r > 0 && gbs > best.gb_per_s) {
          best.gb_per_s = gbs;
          best.strategy = to_string(s);
        }
      }
    }
  }
  // Keep the sums observable so the reads are not optimised away.
  volatile uint64_t keep = 0;
  for (uint64_t v : sinks) keep = keep + v;
  (void)keep;
  return best;
}

}  // namespace metrale
