// Read-bandwidth probe: the denominator of the decode roofline
// (tokens/s <= bandwidth / weight bytes read per token).
//
//   bandwidth_probe [--bytes N] [--threads 1,2] [--reps 5] [--sweep-reps 3] [--json]
//                   [--streams S [--prefetch B --hint t0|t2|nta] [--load avx512|avx2|nt]
//                    [--block B] [--chunk B] [--huge | --small-pages]]
//
// Each thread reads its own contiguous slice of an anonymous buffer far larger than the LLC
// (or, with --chunk, the threads claim chunks of it in turn, as a dynamic work split does).
// By default the probe sweeps read strategies (src/engine/bandwidth.h: streams per thread,
// software prefetch distance and hint, AVX-512 / AVX2 / non-temporal loads, 2 MiB vs 4 KiB
// pages, static or claimed chunks), each `--sweep-reps` passes, then re-measures the fastest
// `--reps` times and reports that strategy's median and best, and which strategy it was: the best
// read bandwidth this machine gives, since a decoding engine that reads better than the probe would
// otherwise show more than 100% of the roofline. Giving --streams measures that one strategy only
// (no sweep). GB/s are 1e9 bytes/s over the timed read of every slice (all threads start together
// at a barrier; the clock runs from the first start to the last end). A standalone program (no
// Google Benchmark; the kernels are the header-only ones of src/engine/bandwidth.h) so
// bench/compare/run.py can build it alone and parse its JSON.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/aligned_buffer.h"
#include "engine/bandwidth.h"

namespace {

using metrale::PrefetchHint;
using metrale::ReadLoad;
using metrale::ReadStrategy;

struct Options {
  size_t bytes = size_t{512} << 20;  // 16x a 32 MiB LLC, so caches do not help
  std::vector<int> threads = {1, 2};
  int reps = 5;
  int sweep_reps = 3;
  bool json = false;
  std::optional<ReadStrategy> only;  // --streams given: measure this strategy alone
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(
      stderr,
      "bandwidth_probe: %s\nusage: bandwidth_probe [--bytes N] [--threads 1,2] [--reps 5] "
      "[--sweep-reps 3] [--json]\n       [--streams 1|2|3|4|6|8|16 [--prefetch BYTES --hint "
      "t0|t2|nta] [--load avx512|avx2|nt|scalar] [--block BYTES] [--chunk BYTES] "
      "[--huge|--small-pages]]\n",
      what.c_str());
  std::exit(2);
}

long parse_positive(const std::string& flag, const std::string& text, bool zero_ok = false) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < (zero_ok ? 0 : 1)) {
    usage_error(flag + ": expected a " + (zero_ok ? "non-negative" : "positive") +
                " integer, found '" + text + "'");
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  ReadStrategy s{.streams = 4, .huge_pages = false};  // the old probe's defaults
  bool fixed = false;
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
    } else if (a == "--reps") {
      o.reps = static_cast<int>(parse_positive(a, value()));
    } else if (a == "--sweep-reps") {
      o.sweep_reps = static_cast<int>(parse_positive(a, value()));
    } else if (a == "--streams") {
      s.streams = static_cast<int>(parse_positive(a, value()));
      fixed = true;
    } else if (a == "--prefetch") {
      s.prefetch_bytes = static_cast<size_t>(parse_positive(a, value(), true));
    } else if (a == "--hint") {
      std::string h = value();
      if (h == "t0")
        s.hint = PrefetchHint::kT0;
      else if (h == "t2")
        s.hint = PrefetchHint::kT2;
      else if (h == "nta")
        s.hint = PrefetchHint::kNta;
      else if (h == "none")
        s.hint = PrefetchHint::kNone;
      else
        usage_error("--hint: expected t0, t2, nta or none, found '" + h + "'");
    } else if (a == "--load") {
      std::string l = value();
      if (l == "avx512")
        s.load = ReadLoad::kAvx512;
      else if (l == "avx2")
        s.load = ReadLoad::kAvx2;
      else if (l == "nt")
        s.load = ReadLoad::kNonTemporal;
      else if (l == "scalar")
        s.load = ReadLoad::kScalar;
      else
        usage_error("--load: expected avx512, avx2, nt or scalar, found '" + l + "'");
    } else if (a == "--block") {
      s.block_bytes = static_cast<size_t>(parse_positive(a, value(), true));
    } else if (a == "--chunk") {
      s.chunk_bytes = static_cast<size_t>(parse_positive(a, value(), true));
    } else if (a == "--huge") {
      s.huge_pages = true;
    } else if (a == "--small-pages") {
      s.huge_pages = false;
    } else if (a == "--json") {
      o.json = true;
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (fixed) {
    if (s.hint != PrefetchHint::kNone && s.prefetch_bytes == 0) s.prefetch_bytes = 1024;
    if (s.hint == PrefetchHint::kNone) s.prefetch_bytes = 0;
    if (!metrale::read_strategy_supported(s))
      usage_error("this CPU cannot run " + metrale::to_string(s));
    o.only = s;
  }
  return o;
}

// An anonymous buffer advised for or against transparent huge pages.
struct Buffer {
  metrale::AlignedBuffer memory;  // owns `data`
  char* data = nullptr;
  size_t bytes = 0;
  bool huge = false;
  double huge_fraction = 0;  // of the mapping backed by huge pages (/proc/self/smaps)
};

// AnonHugePages / Rss of the mapping starting at `addr`, from /proc/self/smaps.
double huge_backed_fraction(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  char want[32];
  std::snprintf(want, sizeof want, "%lx-", reinterpret_cast<unsigned long>(addr));
  bool in = false;
  double rss = 0, huge = 0;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(':') > line.find(' ')) {
      in = line.rfind(want, 0) == 0;
      continue;
    }
    if (!in) continue;
    std::istringstream fields(line);
    std::string key;
    double kb = 0;
    fields >> key >> kb;
    if (key == "Rss:") rss = kb;
    if (key == "AnonHugePages:") huge = kb;
  }
  return rss > 0 ? huge / rss : 0;
}

Buffer make_buffer(size_t bytes, bool huge) {
  Buffer b;
  b.bytes = bytes;
  b.huge = huge;
  // Anonymous memory, like weights copied out of the file (llama.cpp -lm none, metrale's load).
  try {
    b.memory = metrale::AlignedBuffer(
        bytes, huge ? metrale::PageAdvice::kHuge : metrale::PageAdvice::kSmall);
  } catch (const metrale::Error& e) {
    std::fprintf(stderr, "bandwidth_probe: %s\n", e.what());
    std::exit(1);
  }
  void* mem = b.memory.data();
  // Touch every page with non-zero data so no read hits the shared zero page.
  std::memset(mem, 1, bytes);
  b.data = static_cast<char*>(mem);
  b.huge_fraction = huge_backed_fraction(mem);
  return b;
}

// `reps` timed reads of the whole buffer by n_threads threads with strategy s; GB/s each.
std::vector<double> time_reads(const Buffer& buf, int n_threads, const ReadStrategy& s, int reps) {
  const size_t per_thread = buf.bytes / static_cast<size_t>(n_threads) / 64 * 64;
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> starts(static_cast<size_t>(n_threads) * reps);
  std::vector<Clock::time_point> ends(starts.size());
  std::vector<size_t> read(static_cast<size_t>(n_threads) * 8);
  std::vector<uint64_t> sinks(static_cast<size_t>(n_threads) * 8);
  // Dynamic strategies: rep r's threads claim chunks from next[r].
  const size_t chunk = s.chunk_bytes / 64 * 64;
  const size_t n_chunks = chunk ? buf.bytes / chunk : 0;
  std::vector<std::atomic<size_t>> next(static_cast<size_t>(reps));
  std::barrier sync(n_threads);
  std::vector<std::thread> team;
  for (int t = 0; t < n_threads; ++t) {
    team.emplace_back([&, t] {
      const auto i = static_cast<size_t>(t);
      size_t warm = 0;  // one untimed pass settles pages, prefetchers and clocks
      sinks[i * 8] += metrale::read_slice(buf.data + i * per_thread, per_thread, s, &warm);
      for (int r = 0; r < reps; ++r) {
        sync.arrive_and_wait();
        starts[static_cast<size_t>(r * n_threads + t)] = Clock::now();
        size_t n = 0;
        if (chunk) {
          for (size_t c; (c = next[static_cast<size_t>(r)].fetch_add(1)) < n_chunks;) {
            sinks[i * 8] += metrale::read_slice(buf.data + c * chunk, chunk, s, &n);
          }
        } else {
          sinks[i * 8] += metrale::read_slice(buf.data + i * per_thread, per_thread, s, &n);
        }
        ends[static_cast<size_t>(r * n_threads + t)] = Clock::now();
        read[i * 8] = n;
      }
    });
  }
  for (auto& th : team) th.join();
  size_t total = 0;
  uint64_t sink = 0;
  for (int t = 0; t < n_threads; ++t) {
    total += read[static_cast<size_t>(t) * 8];
    sink += sinks[static_cast<size_t>(t) * 8];
  }
  if (sink == 1) std::fprintf(stderr, " ");  // keeps the sums observable
  std::vector<double> gbs;
  for (int r = 0; r < reps; ++r) {
    auto first = starts.begin() + r * n_threads, last = ends.begin() + r * n_threads;
    const double sec = std::chrono::duration<double>(*std::max_element(last, last + n_threads) -
                                                     *std::min_element(first, first + n_threads))
                           .count();
    gbs.push_back(static_cast<double>(total) / sec / 1e9);
  }
  return gbs;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Tried {
  ReadStrategy strategy;
  double median_gbs;
};

struct Result {
  int threads;
  ReadStrategy strategy;
  double best_gbs;
  double median_gbs;
  std::vector<Tried> sweep;  // empty when one strategy was given
};

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string strategy_json(const ReadStrategy& s) {
  static const char* const kLoads[] = {"avx512", "avx2", "nt", "scalar"};
  static const char* const kHints[] = {"none", "t0", "t2", "nta"};
  char text[256];
  std::snprintf(
      text, sizeof text,
      "{\"streams\": %d, \"block_bytes\": %zu, \"prefetch_bytes\": %zu, \"hint\": \"%s\", "
      "\"load\": \"%s\", \"pages\": \"%s\", \"chunk_bytes\": %zu}",
      s.streams, s.block_bytes, s.prefetch_bytes, kHints[static_cast<int>(s.hint)],
      kLoads[static_cast<int>(s.load)], s.huge_pages ? "2M" : "4K", s.chunk_bytes);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.bytes < (size_t{16} << 20))
    usage_error("--bytes: at least 16 MiB, to measure DRAM rather than caches");
  const size_t bytes = o.bytes / 4096 * 4096;
  std::vector<ReadStrategy> grid =
      o.only ? std::vector<ReadStrategy>{*o.only} : metrale::read_strategy_grid();
  bool want_huge = false, want_small = false;
  for (const ReadStrategy& s : grid) (s.huge_pages ? want_huge : want_small) = true;
  Buffer huge_buf, small_buf;
  if (want_huge) huge_buf = make_buffer(bytes, true);
  if (want_small) small_buf = make_buffer(bytes, false);

  std::vector<Result> results;
  for (int t : o.threads) {
    Result r{t, grid.front(), 0, 0, {}};
    if (grid.size() > 1) {
      for (const ReadStrategy& s : grid) {
        const Buffer& b = s.huge_pages ? huge_buf : small_buf;
        r.sweep.push_back({s, median(time_reads(b, t, s, o.sweep_reps))});
      }
      r.strategy =
          std::max_element(r.sweep.begin(), r.sweep.end(), [](const Tried& a, const Tried& b) {
            return a.median_gbs < b.median_gbs;
          })->strategy;
    }
    // The winner (or the one strategy given), measured again on its own.
    std::vector<double> gbs =
        time_reads(r.strategy.huge_pages ? huge_buf : small_buf, t, r.strategy, o.reps);
    r.median_gbs = median(gbs);
    r.best_gbs = *std::max_element(gbs.begin(), gbs.end());
    results.push_back(std::move(r));
  }
  for (Buffer* b : {&huge_buf, &small_buf}) {
    b->memory = metrale::AlignedBuffer();  // frees it; `data` stays set for the report
  }

  if (o.json) {
    std::printf("{\"bytes\": %zu, \"reps\": %d, \"sweep_reps\": %d, \"huge_backed\": {", bytes,
                o.reps, o.sweep_reps);
    bool first = true;
    for (const Buffer* b : {&huge_buf, &small_buf}) {
      if (!b->data) continue;
      std::printf("%s\"%s\": %.3f", first ? "" : ", ", b->huge ? "2M" : "4K", b->huge_fraction);
      first = false;
    }
    std::printf("}, \"threads\": {");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::printf(
          "%s\"%d\": {\"best_gbs\": %.2f, \"median_gbs\": %.2f, \"strategy\": %s, "
          "\"strategy_text\": \"%s\"",
          i ? ", " : "", r.threads, r.best_gbs, r.median_gbs, strategy_json(r.strategy).c_str(),
          json_escape(metrale::to_string(r.strategy)).c_str());
      if (!r.sweep.empty()) {
        std::printf(", \"sweep\": [");
        for (size_t k = 0; k < r.sweep.size(); ++k) {
          std::printf("%s{\"strategy\": \"%s\", \"median_gbs\": %.2f}", k ? ", " : "",
                      json_escape(metrale::to_string(r.sweep[k].strategy)).c_str(),
                      r.sweep[k].median_gbs);
        }
        std::printf("]");
      }
      std::printf("}");
    }
    std::printf("}}\n");
    return 0;
  }
  std::printf(
      "read bandwidth, %zu MiB anonymous buffer per page size, %d reps of the winner (sweep: %d "
      "each)\n",
      bytes >> 20, o.reps, o.sweep_reps);
  for (const Buffer* b : {&huge_buf, &small_buf}) {
    if (b->data)
      std::printf("  %s-advised buffer: %.0f%% in huge pages\n", b->huge ? "huge" : "no-huge",
                  100 * b->huge_fraction);
  }
  for (const Result& r : results) {
    if (!r.sweep.empty()) {
      std::vector<Tried> sorted = r.sweep;
      std::sort(sorted.begin(), sorted.end(),
                [](const Tried& a, const Tried& b) { return a.median_gbs > b.median_gbs; });
      std::printf("  %d thread(s), sweep (median of %d each):\n", r.threads, o.sweep_reps);
      for (const Tried& s : sorted)
        std::printf("    %6.2f GB/s  %s\n", s.median_gbs, metrale::to_string(s.strategy).c_str());
    }
    std::printf("  %2d thread(s): best %6.2f GB/s  median %6.2f GB/s  (%s)\n", r.threads,
                r.best_gbs, r.median_gbs, metrale::to_string(r.strategy).c_str());
  }
  return 0;
}
