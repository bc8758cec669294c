#pragma once
// A STREAM-like read probe: how fast this machine streams memory into the cores, measured
// on the spot so roofline figures use this run's bandwidth, not a datasheet's.
//
// "How fast" depends on how the reading is done, and the best way differs between CPUs. On
// a Zen 4 VM the old fixed read (4 streams per thread over 4 KiB pages) under-read what
// llama.cpp's decode streamed: there 2 MiB pages mattered most, the stream count little, and
// software prefetch cost more than it gave, while on a Zen 5 VM prefetching several streams
// was what helped. So the probe sweeps read strategies (streams per thread, software
// prefetch distance and hint, AVX-512 / AVX2 / non-temporal loads, 4 KiB vs 2 MiB pages)
// and reports the best with its winner; a roofline must divide by the best the machine
// gives, or an engine that reads better than the probe shows > 100%.
//
// The read kernels are header-only and depend on nothing but the standard library, so
// bench/bandwidth_probe.cc (built standalone by bench/compare/run.py) shares them.
// `bandwidth_probe --streams S [--block B --prefetch D --hint nta ...]` measures one
// strategy, e.g. a kernel's own access pattern (3 streams of 32 KiB blocks, NTA 3 KiB ahead,
// is the pre-interleave bf16 decode kernel on a 1024-wide layer).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace metrale {

class ThreadPool;

enum class ReadLoad { kAvx512, kAvx2, kNonTemporal, kScalar };  // kNonTemporal: vmovntdqa zmm
enum class PrefetchHint { kNone, kT0, kT2, kNta };              // _mm_prefetch hints

struct ReadStrategy {
  int streams = 1;            // sequential streams a thread reads in lockstep: 1-4, 6, 8, 16
  size_t block_bytes = 0;     // 0: each stream spans 1/streams of the thread's slice; else the
                              // slice is read tile by tile, a tile being `streams` adjacent
                              // blocks (a GEMV walking `streams` weight groups at a time)
  size_t prefetch_bytes = 0;  // software prefetch this far ahead in each stream (0: none)
  PrefetchHint hint = PrefetchHint::kNone;
  ReadLoad load = ReadLoad::kAvx512;
  bool huge_pages = true;  // buffer advised MADV_HUGEPAGE (else MADV_NOHUGEPAGE: 4 KiB)
  size_t chunk_bytes = 0;  // 0: each thread reads one static slice; else the threads claim
                           // chunks of this size in turn, as an engine's dynamic split does
                           // (a thread the VM slows then reads less)
};

struct BandwidthResult {
  double gb_per_s = 0;   // the best strategy's best repetition, 1e9 bytes per second
  size_t bytes = 0;      // buffer size read per repetition
  std::string strategy;  // the strategy that read fastest (to_string)
};

// Sweeps read strategies (read_strategy_grid) over a buffer of `bytes` (far larger than the
// last-level cache), each thread of `pool` reading its own slice; returns the best.
BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{512} << 20,
                                       int reps = 3);

namespace bandwidth_detail {

constexpr size_t kLine = 64;

#if defined(__x86_64__)
template <int kHint>
inline void prefetch(const char* p) {
  if constexpr (kHint == static_cast<int>(PrefetchHint::kT0)) _mm_prefetch(p, _MM_HINT_T0);
  if constexpr (kHint == static_cast<int>(PrefetchHint::kT2)) _mm_prefetch(p, _MM_HINT_T2);
  if constexpr (kHint == static_cast<int>(PrefetchHint::kNta)) _mm_prefetch(p, _MM_HINT_NTA);
}

// `lines` lines of each of kS streams `stride` bytes apart from `base`, one line per stream
// in turn; prefetching `pf` bytes ahead of each when kHint is not kNone.
template <int kS, int kHint, bool kNt>
__attribute__((target("avx512f"))) inline uint64_t tile_avx512(const char* base, size_t stride,
                                                               size_t lines, size_t pf) {
  __m512i acc[kS];
#pragma GCC unroll 16
  for (int s = 0; s < kS; ++s) acc[s] = _mm512_setzero_si512();
  for (size_t i = 0; i < lines; ++i) {
#pragma GCC unroll 16
    for (int s = 0; s < kS; ++s) {
      const char* p = base + static_cast<size_t>(s) * stride + i * kLine;
      if constexpr (kHint != 0) prefetch<kHint>(p + pf);
      __m512i v;
      if constexpr (kNt) {
        v = _mm512_stream_load_si512(const_cast<void*>(static_cast<const void*>(p)));
      } else {
        v = _mm512_load_si512(p);
      }
      acc[s] = _mm512_add_epi64(acc[s], v);
    }
  }
  __m512i total = _mm512_setzero_si512();
#pragma GCC unroll 16
  for (int s = 0; s < kS; ++s) total = _mm512_add_epi64(total, acc[s]);
  alignas(64) uint64_t lanes[8];  // (g++ 12's _mm512_reduce_add_epi64 trips -Wuninitialized)
  _mm512_store_si512(lanes, total);
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  return sum;
}

// Two 32-byte loads per line.
template <int kS, int kHint>
__attribute__((target("avx2"))) inline uint64_t tile_avx2(const char* base, size_t stride,
                                                          size_t lines, size_t pf) {
  __m256i acc[kS];
#pragma GCC unroll 16
  for (int s = 0; s < kS; ++s) acc[s] = _mm256_setzero_si256();
  for (size_t i = 0; i < lines; ++i) {
#pragma GCC unroll 16
    for (int s = 0; s < kS; ++s) {
      const char* p = base + static_cast<size_t>(s) * stride + i * kLine;
      if constexpr (kHint != 0) prefetch<kHint>(p + pf);
      const auto* v = reinterpret_cast<const __m256i*>(p);
      acc[s] = _mm256_add_epi64(acc[s],
                                _mm256_add_epi64(_mm256_load_si256(v), _mm256_load_si256(v + 1)));
    }
  }
  __m256i total = _mm256_setzero_si256();
#pragma GCC unroll 16
  for (int s = 0; s < kS; ++s) total = _mm256_add_epi64(total, acc[s]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

template <int kS>
inline uint64_t tile_scalar(const char* base, size_t stride, size_t lines) {
  uint64_t acc = 0;
  for (size_t i = 0; i < lines; ++i) {
    for (int s = 0; s < kS; ++s) {
      const auto* p =
          reinterpret_cast<const uint64_t*>(base + static_cast<size_t>(s) * stride + i * kLine);
      for (int k = 0; k < 8; ++k) acc += p[k];
    }
  }
  return acc;
}

using TileFn = uint64_t (*)(const char*, size_t, size_t, size_t);

template <int kS>
inline uint64_t scalar_fn(const char* b, size_t st, size_t n, size_t) {
  return tile_scalar<kS>(b, st, n);
}

template <int kS>
inline TileFn pick_for_streams(const ReadStrategy& s) {
#if defined(__x86_64__)
  const int h = static_cast<int>(s.hint);
  if (s.load == ReadLoad::kAvx512 || s.load == ReadLoad::kNonTemporal) {
    const bool nt = s.load == ReadLoad::kNonTemporal;
    switch (h) {
      case 1:
        return nt ? &tile_avx512<kS, 1, true> : &tile_avx512<kS, 1, false>;
      case 2:
        return nt ? &tile_avx512<kS, 2, true> : &tile_avx512<kS, 2, false>;
      case 3:
        return nt ? &tile_avx512<kS, 3, true> : &tile_avx512<kS, 3, false>;
      default:
        return nt ? &tile_avx512<kS, 0, true> : &tile_avx512<kS, 0, false>;
    }
  }
  if (s.load == ReadLoad::kAvx2) {
    switch (h) {
      case 1:
        return &tile_avx2<kS, 1>;
      case 2:
        return &tile_avx2<kS, 2>;
      case 3:
        return &tile_avx2<kS, 3>;
      default:
        return &tile_avx2<kS, 0>;
    }
  }
#endif
  return &scalar_fn<kS>;
}

inline TileFn pick(const ReadStrategy& s) {
  switch (s.streams) {
    case 1:
      return pick_for_streams<1>(s);
    case 2:
      return pick_for_streams<2>(s);
    case 3:
      return pick_for_streams<3>(s);
    case 4:
      return pick_for_streams<4>(s);
    case 6:
      return pick_for_streams<6>(s);
    case 8:
      return pick_for_streams<8>(s);
    case 16:
      return pick_for_streams<16>(s);
    default:
      return nullptr;
  }
}

}  // namespace bandwidth_detail

// Whether this CPU can run `s` (its load instructions, its stream count).
inline bool read_strategy_supported(const ReadStrategy& s) {
  if (bandwidth_detail::pick(s) == nullptr) return false;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (s.load == ReadLoad::kAvx512 || s.load == ReadLoad::kNonTemporal)
    return __builtin_cpu_supports("avx512f");
  if (s.load == ReadLoad::kAvx2) return __builtin_cpu_supports("avx2");
  return true;
#else
  return s.load == ReadLoad::kScalar && s.hint == PrefetchHint::kNone;
#endif
}

// Reads [p, p + bytes) (64-byte aligned) with strategy `s`; returns a checksum to keep
// observable and adds the bytes actually read (whole tiles only) to *read.
inline uint64_t read_slice(const void* p, size_t bytes, const ReadStrategy& s, size_t* read) {
  using namespace bandwidth_detail;
  const auto streams = static_cast<size_t>(s.streams);
  const size_t block =
      s.block_bytes ? s.block_bytes / kLine * kLine : bytes / streams / kLine * kLine;
  if (block == 0) return 0;
  const TileFn fn = pick(s);
  const auto* base = static_cast<const char*>(p);
  uint64_t sum = 0;
  size_t done = 0;
  for (; done + streams * block <= bytes; done += streams * block) {
    sum += fn(base + done, block, block / kLine, s.prefetch_bytes);
  }
  *read += done;
  return sum;
}

inline std::string to_string(const ReadStrategy& s) {
  static const char* const kLoads[] = {"avx512", "avx2", "nt-avx512", "scalar"};
  static const char* const kHints[] = {"none", "t0", "t2", "nta"};
  char text[160];
  std::snprintf(text, sizeof text, "%d stream%s%s%s, %s loads, prefetch %s", s.streams,
                s.streams == 1 ? "" : "s", s.block_bytes ? " of " : "",
                s.block_bytes ? (std::to_string(s.block_bytes >> 10) + " KiB blocks").c_str() : "",
                kLoads[static_cast<int>(s.load)],
                s.hint == PrefetchHint::kNone ? "none"
                                              : (std::string(kHints[static_cast<int>(s.hint)]) +
                                                 " +" + std::to_string(s.prefetch_bytes) + " B")
                                                    .c_str());
  std::string out = std::string(text) + (s.huge_pages ? ", 2 MiB pages" : ", 4 KiB pages");
  if (s.chunk_bytes) out += ", claimed in " + std::to_string(s.chunk_bytes >> 10) + " KiB chunks";
  return out;
}

// The strategies the sweep tries, per page size: streams 1/2/4/8 with AVX-512 loads and no,
// near and far software prefetch (T0 and NTA), AVX2 and non-temporal loads on 1, 2 and 4
// streams, and one GEMV-like tiled read (3 streams of 32 KiB blocks, NTA 3 KiB ahead: the
// pattern of metrale's bf16 decode kernel on a 1024-wide layer). Only what this CPU runs.
inline std::vector<ReadStrategy> read_strategy_grid() {
  std::vector<ReadStrategy> out;
  for (bool huge : {true, false}) {
    for (int streams : {1, 2, 4, 8}) {
      out.push_back({.streams = streams, .huge_pages = huge});
      for (PrefetchHint hint : {PrefetchHint::kT0, PrefetchHint::kNta}) {
        for (size_t ahead : {size_t{1024}, size_t{4096}}) {
          out.push_back(
              {.streams = streams, .prefetch_bytes = ahead, .hint = hint, .huge_pages = huge});
        }
      }
    }
    for (ReadLoad load : {ReadLoad::kAvx2, ReadLoad::kNonTemporal}) {
      for (int streams : {1, 2, 4})
        out.push_back({.streams = streams, .load = load, .huge_pages = huge});
    }
    for (int streams : {1, 4}) {
      out.push_back({.streams = streams, .huge_pages = huge, .chunk_bytes = size_t{1} << 20});
    }
    out.push_back({.streams = 3,
                   .block_bytes = 32 << 10,
                   .prefetch_bytes = 3072,
                   .hint = PrefetchHint::kNta,
                   .huge_pages = huge});
  }
  std::vector<ReadStrategy> supported;
  for (const ReadStrategy& s : out) {
    if (read_strategy_supported(s)) supported.push_back(s);
  }
  if (supported.empty()) supported.push_back({.streams = 4, .load = ReadLoad::kScalar});
  return supported;
}

}  // namespace metrale
