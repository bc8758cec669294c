// STREAM-like read-bandwidth probe: the denominator of the decode roofline
// (tokens/s <= bandwidth / weight bytes read per token).
//
//   bandwidth_probe [--bytes N] [--threads 1,2] [--streams 4] [--reps 10] [--huge] [--json]
//
// Each thread sums its own contiguous slice of one anonymous buffer far larger than the LLC.
// A slice is read as `streams` independent sequential streams at once (each with its own
// accumulator), because one stream per core leaves the hardware prefetchers under-used and
// under-reports what a GEMV that walks several weight rows at a time can pull. Reported GB/s
// are 1e9 bytes/s over the timed read of the whole buffer (all threads start together at a
// barrier; the clock stops when the last one finishes). A standalone program with its own
// main (no Google Benchmark) so bench/compare/run.py can parse its JSON directly.
#include <sys/mman.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

// 64-byte vectors: one cache line per load; GCC lowers them to whatever width the clone has.
typedef uint64_t Line __attribute__((vector_size(64)));

struct Options {
  size_t bytes = size_t{1} << 30;  // 1 GiB: 32x a 32 MiB LLC, so caches do not help
  std::vector<int> threads = {1, 2};
  size_t streams = 4;
  int reps = 10;
  bool huge = false;
  bool json = false;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "bandwidth_probe: %s\nusage: bandwidth_probe [--bytes N] [--threads 1,2] "
               "[--streams 4] [--reps 10] [--huge] [--json]\n",
               what.c_str());
  std::exit(2);
}

long parse_positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v <= 0) {
    usage_error(flag + ": expected a positive integer, found '" + text + "'");
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + ": missing value");
      return argv[++i];
    };
    if (a == "--bytes") {
      o.bytes = static_cast<size_t>(parse_positive(a, value()));
    } else if (a == "--threads") {
      o.threads.clear();
      std::string list = value();
      size_t pos = 0;
      while (pos <= list.size()) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        long t = parse_positive(a, list.substr(pos, comma - pos));
        if (t > 1024) usage_error(a + ": at most 1024 threads, found " + std::to_string(t));
        o.threads.push_back(static_cast<int>(t));
        pos = comma + 1;
      }
    } else if (a == "--streams") {
      o.streams = static_cast<size_t>(parse_positive(a, value()));
      if (o.streams != 1 && o.streams != 2 && o.streams != 4 && o.streams != 8 &&
          o.streams != 16) {
        usage_error(a + ": expected 1, 2, 4, 8 or 16, found " + std::to_string(o.streams));
      }
    } else if (a == "--reps") {
      o.reps = static_cast<int>(parse_positive(a, value()));
    } else if (a == "--huge") {
      o.huge = true;
    } else if (a == "--json") {
      o.json = true;
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  return o;
}

// Sums `n_lines` lines from each of kStreams streams that start `stride` lines apart. The
// stream count is a template parameter so the accumulators live in registers.
template <size_t kStreams>
[[gnu::always_inline]] inline uint64_t sum_streams_body(const Line* base, size_t stride,
                                                        size_t n_lines) {
  Line acc[kStreams] = {};
  for (size_t i = 0; i < n_lines; ++i) {
    // Unrolled even at -O2, otherwise the accumulators round-trip through the stack.
#pragma GCC unroll 16
    for (size_t s = 0; s < kStreams; ++s) acc[s] += base[s * stride + i];
  }
  Line total = {};
  for (size_t s = 0; s < kStreams; ++s) total += acc[s];
  uint64_t out = 0;
  for (int k = 0; k < 8; ++k) out += total[k];
  return out;
}

// The clones give the loop full-width loads on AVX-512 / AVX2 machines without building the
// probe for one ISA (clang allows target_clones only on non-template functions).
__attribute__((target_clones("avx512f", "avx2", "default"))) uint64_t sum_streams(
    const Line* base, size_t streams, size_t stride, size_t n_lines) {
  switch (streams) {
    case 1: return sum_streams_body<1>(base, stride, n_lines);
    case 2: return sum_streams_body<2>(base, stride, n_lines);
    case 4: return sum_streams_body<4>(base, stride, n_lines);
    case 8: return sum_streams_body<8>(base, stride, n_lines);
    default: return sum_streams_body<16>(base, stride, n_lines);
  }
}

struct Result {
  int threads;
  double best_gbs;
  double median_gbs;
};

Result measure(const Line* buf, size_t n_lines, int n_threads, const Options& o) {
  // Slice per thread, then per stream; the few tail lines that do not divide are skipped and
  // not counted.
  size_t per_thread = n_lines / static_cast<size_t>(n_threads);
  size_t per_stream = per_thread / o.streams;
  double bytes_read = static_cast<double>(per_stream * o.streams * static_cast<size_t>(n_threads)) *
                      sizeof(Line);
  std::vector<double> gbs;
  std::vector<uint64_t> sinks(static_cast<size_t>(n_threads));
  for (int rep = 0; rep < o.reps; ++rep) {
    // Each thread stamps its own start and end: the span from the first start to the last
    // end is the time the buffer took, without thread creation or join latency in it.
    using Clock = std::chrono::steady_clock;
    std::vector<Clock::time_point> starts(static_cast<size_t>(n_threads));
    std::vector<Clock::time_point> ends(static_cast<size_t>(n_threads));
    std::barrier sync(n_threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < n_threads; ++t) {
      pool.emplace_back([&, t] {
        auto i = static_cast<size_t>(t);
        sync.arrive_and_wait();
        starts[i] = Clock::now();
        sinks[i] += sum_streams(buf + i * per_thread, o.streams, per_stream, per_stream);
        ends[i] = Clock::now();
      });
    }
    for (auto& th : pool) th.join();
    double s = std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) -
                                             *std::min_element(starts.begin(), starts.end()))
                   .count();
    gbs.push_back(bytes_read / s / 1e9);
  }
  uint64_t sink = 0;
  for (uint64_t v : sinks) sink += v;
  if (sink == 1) std::fprintf(stderr, " ");  // keeps the sums observable
  std::sort(gbs.begin(), gbs.end());
  return {n_threads, gbs.back(), gbs[gbs.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  size_t n_lines = o.bytes / sizeof(Line);
  if (n_lines < o.streams * 1024) usage_error("--bytes: buffer too small to measure DRAM");
  size_t bytes = n_lines * sizeof(Line);
  // Anonymous memory, like weights copied out of the file (llama.cpp -mmp 0, metrale's load).
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::fprintf(stderr, "bandwidth_probe: mmap of %zu bytes failed: %s\n", bytes,
                 std::strerror(errno));
    return 1;
  }
  if (o.huge && madvise(mem, bytes, MADV_HUGEPAGE) != 0) {
    std::fprintf(stderr, "bandwidth_probe: madvise(MADV_HUGEPAGE) failed: %s\n",
                 std::strerror(errno));
  }
  // Touch every page with non-zero data so no read hits the shared zero page.
  std::memset(mem, 1, bytes);
  const Line* buf = static_cast<const Line*>(mem);

  std::vector<Result> results;
  for (int t : o.threads) results.push_back(measure(buf, n_lines, t, o));
  munmap(mem, bytes);

  if (o.json) {
    std::printf("{\"bytes\": %zu, \"streams_per_thread\": %zu, \"reps\": %d, \"huge\": %s, "
                "\"threads\": {",
                bytes, o.streams, o.reps, o.huge ? "true" : "false");
    for (size_t i = 0; i < results.size(); ++i) {
      std::printf("%s\"%d\": {\"best_gbs\": %.2f, \"median_gbs\": %.2f}", i ? ", " : "",
                  results[i].threads, results[i].best_gbs, results[i].median_gbs);
    }
    std::printf("}}\n");
  } else {
    std::printf("read bandwidth, %zu MiB anonymous buffer, %zu streams/thread, %d reps%s\n",
                bytes >> 20, o.streams, o.reps, o.huge ? ", MADV_HUGEPAGE" : "");
    for (const Result& r : results) {
      std::printf("  %2d thread(s): best %6.2f GB/s  median %6.2f GB/s\n", r.threads, r.best_gbs,
                  r.median_gbs);
    }
  }
  return 0;
}
