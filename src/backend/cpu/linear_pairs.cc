// The bf16-compute linear kernel (layout and summation order in linear_pairs.h), in AVX-512
// intrinsics chosen at run time, like linear_packed.cc.
#include "backend/cpu/linear_pairs.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

#if defined(__x86_64__)
// g++ 12's AVX-512 headers trip -Wmaybe-uninitialized (see linear_packed.cc).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
// One target for both variants: the emulated instantiation issues no AVX512_BF16 instruction,
// so it runs on any AVX-512 F+BW+VL CPU even though its function carries the feature.
#define METRALE_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define METRALE_UNROLL _Pragma("GCC unroll 16")
#endif

namespace metrale::cpu {

inline constexpr int64_t kGroup = 16;
inline constexpr int64_t kTile = kPairsTileGroups;
// Values from one line of a group to its next (the tile's other groups sit between).
inline constexpr int64_t kLineStride = kTile * kGroup * 2;

size_t pairs_bf16_bytes(int64_t n_out, int64_t n_in) {
  const int64_t tiles = (n_out + kTile * kGroup - 1) / (kTile * kGroup);
  return static_cast<size_t>(tiles * kTile * kGroup * n_in) * sizeof(uint16_t);
}

namespace {

// Value offset of line(g, p) (linear_pairs.h): tiles of kTile groups, lines interleaved by p.
inline int64_t line_offset(int64_t n_pairs, int64_t g, int64_t p) {
  return ((g / kTile * n_pairs + p) * kTile + g % kTile) * kGroup * 2;
}

// Index of w[row][k] inside the pair-packed array.
inline size_t pairs_index(int64_t n_in, int64_t row, int64_t k) {
  return static_cast<size_t>(line_offset(n_in / 2, row / kGroup, k / 2) + (row % kGroup) * 2 +
                             k % 2);
}

}  // namespace

void pack_pairs_bf16(const uint16_t* src, int64_t n_out, int64_t n_in, uint16_t* dst) {
  std::memset(dst, 0, pairs_bf16_bytes(n_out, n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    const uint16_t* row = src + o * n_in;
    for (int64_t k = 0; k < n_in; ++k) dst[pairs_index(n_in, o, k)] = row[k];
  }
}

void unpack_pairs_row(const uint16_t* packed, int64_t n_in, int64_t row, float* out) {
  for (int64_t k = 0; k < n_in; ++k) out[k] = bf16_to_f32(packed[pairs_index(n_in, row, k)]);
}

#if defined(__x86_64__)
namespace {

// acc += x[2p+1] * w[2p+1] + x[2p] * w[2p] per lane, in that order (linear_pairs.h).
template <bool kNative>
METRALE_BF16_TARGET inline __m512 dot2(__m512 acc, __m512i w, __m512i x) {
  if constexpr (kNative) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(x));
  } else {
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(x, high)),
                          _mm512_castsi512_ps(_mm512_and_si512(w, high)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), acc);
  }
}

// Decode-sized calls are bound by reading the weights. With the tile's groups interleaved
// (linear_pairs.h) a tile is one sequential stream, which the hardware prefetchers follow
// without help: no software prefetch. (When each group was its own stream, prefetching each
// 3 KiB ahead, non-temporal, gained 17-23% on one Zen 5 thread but lost ~25% on a Zen 4 VM,
// where llama.cpp's plain row reads then out-read it; one stream unprefetched was fastest on
// the Zen 4 VM by ~25-30% over the old 3-stream prefetched kernel.)

// Cache lines of weights a tile call prefetches into L2 for the next layout tile, spread over
// its k pairs: one line every `every` pairs (lines * every <= n_pairs), from `from` on.
// 16 bytes, so it is passed in two registers (24 were passed through the stack, and the
// reload after the caller's stores showed in profiles).
struct Prefetch {
  const char* from = nullptr;
  int32_t lines = 0;
  int32_t every = 0;
};
static_assert(sizeof(Prefetch) == 16);

// x rows [r0, r0 + R) against groups [g0, g0 + C): R x C accumulators of 16 outputs each,
// one weight line per group and one broadcast pair per row for each k pair.
template <int R, int C, bool kNative>
METRALE_BF16_TARGET void tile(const PairsTask& t, int64_t g0, int64_t r0, int64_t o_end,
                              Prefetch pf) {
  const int64_t n_pairs = t.n_in / 2;
  __m512 acc[R][C];
  METRALE_UNROLL for (int r = 0; r < R; ++r) METRALE_UNROLL for (int c = 0; c < C; ++c) acc[r][c] =
      _mm512_setzero_ps();
  const uint16_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = t.x + (r0 + r) * t.n_in;
  const uint16_t* w[C];
  for (int c = 0; c < C; ++c) w[c] = t.w + line_offset(n_pairs, g0 + c, 0);
  int64_t next_pf = pf.lines > 0 ? 0 : -1;  // the k pair that issues the next prefetch
  int64_t pf_left = pf.lines;
  for (int64_t p = 0; p < n_pairs; ++p) {
    if (p == next_pf) {
      _mm_prefetch(pf.from, _MM_HINT_T1);
      pf.from += 64;
      next_pf = --pf_left > 0 ? next_pf + pf.every : -1;
    }
    __m512i wv[C];
    METRALE_UNROLL for (int c = 0; c < C; ++c) wv[c] = _mm512_load_si512(w[c] + p * kLineStride);
    METRALE_UNROLL for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, x[r] + 2 * p, sizeof(pair));
      const __m512i xb = _mm512_set1_epi32(static_cast<int>(pair));
      METRALE_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = dot2<kNative>(acc[r][c], wv[c], xb);
    }
  }
  for (int c = 0; c < C; ++c) {
    const int64_t o = (g0 + c) * kGroup;
    const int64_t valid = std::min(kGroup, o_end - o);
    const auto mask = static_cast<__mmask16>((1u << valid) - 1u);
    const __m512 bias =
        t.bias != nullptr ? _mm512_maskz_loadu_ps(mask, t.bias + o) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m512 v = t.bias != nullptr ? _mm512_add_ps(acc[r][c], bias) : acc[r][c];
      _mm512_mask_storeu_ps(t.y.row(r0 + r) + o, mask, v);
    }
  }
}

// Rows per tile and groups per tile: 8 x 3 keeps 24 accumulators + 3 weight lines + one
// broadcast in the 32 zmm registers. (Decode calls of <= 4 rows are bound by reading the
// weights; 3 groups give 3 independent accumulator chains per row, enough to cover
// vdpbf16ps's latency at a core's memory bandwidth.)
constexpr int kTileRows = 8;
constexpr int kTileGroups = kPairsTileGroups;
using TileFn = void (*)(const PairsTask&, int64_t, int64_t, int64_t, Prefetch);

template <bool kNative, int R>
constexpr void fill_row(TileFn (&row)[kTileGroups]) {
  row[0] = &tile<R, 1, kNative>;
  row[1] = &tile<R, 2, kNative>;
  row[2] = &tile<R, 3, kNative>;
}

template <bool kNative>
struct Tiles {
  TileFn fn[kTileRows][kTileGroups]{};
  constexpr Tiles() {
    fill_row<kNative, 1>(fn[0]);
    fill_row<kNative, 2>(fn[1]);
    fill_row<kNative, 3>(fn[2]);
    fill_row<kNative, 4>(fn[3]);
    fill_row<kNative, 5>(fn[4]);
    fill_row<kNative, 6>(fn[5]);
    fill_row<kNative, 7>(fn[6]);
    fill_row<kNative, 8>(fn[7]);
  }
};

// Row blocks from which a call prefetches the next tile's weights (below: decode-sized calls,
// which are bound by reading the weights and read them best as one unprefetched stream).
constexpr int64_t kPrefetchBlocks = 4;

template <bool kNative>
void linear_pairs(const PairsTask& t, int64_t o_begin, int64_t o_end) {
  static constexpr Tiles<kNative> kTiles;
  const int64_t g_end = (o_end + kGroup - 1) / kGroup;
  const int64_t n_pairs = t.n_in / 2;
  const int64_t blocks = (t.n_rows + kTileRows - 1) / kTileRows;
  // The matrix's groups, the padding of its last layout tile included.
  const int64_t g_all = (t.n_out + kTile * kGroup - 1) / (kTile * kGroup) * kTile;
  const int64_t tile_lines = n_pairs * kTile;  // a layout tile: n_pairs lines of 64 bytes per group
  // Lines of the next tile each row block prefetches (the last blocks may have fewer left) and
  // the k pairs between two of its prefetches, worked out once per call: a division per tile
  // call (~10^4 cycles of work each) showed as ~4% of an embedding run's samples.
  const int64_t per_block = (tile_lines + blocks - 1) / blocks;
  const int64_t every = std::max<int64_t>(1, n_pairs / std::max<int64_t>(1, per_block));
  // Group tiles outside, row tiles inside: a tile's weights (3 x 16 x n_in bf16, <= 288 KiB at
  // n_in 3072) stay in L2 while every row block passes over them. A range starting inside a
  // layout tile first finishes that tile, so the tiles after it are whole.
  //
  // The first row block would read the tile from DRAM at the rate it computes (192 bytes per
  // 24 vdpbf16ps, ~60 GB/s on one Zen 5 core at 2 per cycle), which DRAM cannot feed, and
  // every later block from L2. So with several row blocks each block also prefetches its share
  // of the next layout tile into L2 (even past o_end: the next piece, whichever thread takes
  // it), spread over its k pairs: the weights then stream from DRAM at the average rate the
  // compute needs instead of in bursts it waits for.
  for (int64_t g = o_begin / kGroup; g < g_end;) {
    const int64_t nc = std::min<int64_t>(kTileGroups - g % kTileGroups, g_end - g);
    const int64_t g_next = (g / kTile + 1) * kTile;  // the next layout tile's first group
    const bool prefetch = blocks >= kPrefetchBlocks && g_next < g_all;
    const char* next =
        prefetch ? reinterpret_cast<const char*>(t.w + line_offset(n_pairs, g_next, 0)) : nullptr;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kTileRows;
      const int64_t nr = std::min<int64_t>(kTileRows, t.n_rows - r0);
      Prefetch pf;
      if (prefetch) {
        // kPrefetchBlocks >= 4 keeps per_block <= n_pairs, so every line fits the pass.
        const int64_t first = b * per_block;
        if (first < tile_lines)
          pf = {.from = next + first * 64,
                .lines = static_cast<int32_t>(std::min(per_block, tile_lines - first)),
                .every = static_cast<int32_t>(every)};
      }
      kTiles.fn[nr - 1][nc - 1](t, g, r0, o_end, pf);
    }
    g += nc;
  }
}

// AVX2 + FMA (CPUs without AVX-512): the same two FMAs per k pair as the AVX-512F twin, on
// the two 32-byte halves of each line (outputs 0-7 and 8-15 of the group), so the sums are
// the same bits. One group at a time, up to 4 rows: 8 accumulators and 2 weight halves fit
// the 16 ymm registers.
#define METRALE_AVX2_TARGET __attribute__((target("avx2,fma")))
template <int R>
METRALE_AVX2_TARGET void tile_avx2(const PairsTask& t, int64_t g, int64_t r0, int64_t o_end) {
  const int64_t n_pairs = t.n_in / 2;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256 acc[R][2];
  METRALE_UNROLL for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const uint16_t* w = t.w + line_offset(n_pairs, g, 0);
  for (int64_t p = 0; p < n_pairs; ++p) {
    const auto* line = reinterpret_cast<const __m256i*>(w + p * kLineStride);
    const __m256i wv[2] = {_mm256_load_si256(line), _mm256_load_si256(line + 1)};
    METRALE_UNROLL for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, t.x + (r0 + r) * t.n_in + 2 * p, sizeof(pair));
      const __m256i xb = _mm256_set1_epi32(static_cast<int>(pair));
      const __m256 x_hi = _mm256_castsi256_ps(_mm256_and_si256(xb, high));
      const __m256 x_lo = _mm256_castsi256_ps(_mm256_slli_epi32(xb, 16));
      METRALE_UNROLL for (int h = 0; h < 2; ++h) {
        acc[r][h] =
            _mm256_fmadd_ps(x_hi, _mm256_castsi256_ps(_mm256_and_si256(wv[h], high)), acc[r][h]);
        acc[r][h] =
            _mm256_fmadd_ps(x_lo, _mm256_castsi256_ps(_mm256_slli_epi32(wv[h], 16)), acc[r][h]);
      }
    }
  }
  const int64_t o = g * kGroup;
  const int64_t valid = std::min(kGroup, o_end - o);
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[kGroup];
    _mm256_store_ps(out, acc[r][0]);
    _mm256_store_ps(out + 8, acc[r][1]);
    float* y = t.y.row(r0 + r) + o;
    for (int64_t i = 0; i < valid; ++i) y[i] = t.bias != nullptr ? out[i] + t.bias[o + i] : out[i];
  }
}

// One row against C groups of a layout tile at once (decode): the tile's interleaved lines
// are then read as one sequential stream, as the AVX-512 kernel reads them. Per group and
// lane the same two FMAs in the same order as tile_avx2, so the same bits.
template <int C>
METRALE_AVX2_TARGET void tile_avx2_row(const PairsTask& t, int64_t g0, int64_t r, int64_t o_end) {
  const int64_t n_pairs = t.n_in / 2;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256 acc[C][2];
  METRALE_UNROLL for (int c = 0; c < C; ++c) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
  const uint16_t* w[C];
  for (int c = 0; c < C; ++c) w[c] = t.w + line_offset(n_pairs, g0 + c, 0);
  const uint16_t* x = t.x + r * t.n_in;
  for (int64_t p = 0; p < n_pairs; ++p) {
    uint32_t pair;
    std::memcpy(&pair, x + 2 * p, sizeof(pair));
    const __m256i xb = _mm256_set1_epi32(static_cast<int>(pair));
    const __m256 x_hi = _mm256_castsi256_ps(_mm256_and_si256(xb, high));
    const __m256 x_lo = _mm256_castsi256_ps(_mm256_slli_epi32(xb, 16));
    METRALE_UNROLL for (int c = 0; c < C; ++c) {
      const auto* line = reinterpret_cast<const __m256i*>(w[c] + p * kLineStride);
      METRALE_UNROLL for (int h = 0; h < 2; ++h) {
        const __m256i wv = _mm256_load_si256(line + h);
        acc[c][h] =
            _mm256_fmadd_ps(x_hi, _mm256_castsi256_ps(_mm256_and_si256(wv, high)), acc[c][h]);
        acc[c][h] =
            _mm256_fmadd_ps(x_lo, _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16)), acc[c][h]);
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    const int64_t o = (g0 + c) * kGroup;
    const int64_t valid = std::min(kGroup, o_end - o);
    alignas(32) float out[kGroup];
    _mm256_store_ps(out, acc[c][0]);
    _mm256_store_ps(out + 8, acc[c][1]);
    float* y = t.y.row(r) + o;
    for (int64_t i = 0; i < valid; ++i) y[i] = t.bias != nullptr ? out[i] + t.bias[o + i] : out[i];
  }
}

void linear_pairs_avx2(const PairsTask& t, int64_t o_begin, int64_t o_end) {
  const int64_t g_end = (o_end + kGroup - 1) / kGroup;
  for (int64_t g0 = o_begin / kGroup; g0 < g_end;) {
    const int64_t nc = std::min<int64_t>(kTileGroups - g0 % kTileGroups, g_end - g0);
    if (t.n_rows <= 4) {
      // Decode: every row reads the tile as one stream (rows after the first from cache).
      for (int64_t r = 0; r < t.n_rows; ++r) {
        switch (nc) {
          case 1:
            tile_avx2_row<1>(t, g0, r, o_end);
            break;
          case 2:
            tile_avx2_row<2>(t, g0, r, o_end);
            break;
          default:
            tile_avx2_row<3>(t, g0, r, o_end);
            break;
        }
      }
    } else {
      for (int64_t g = g0; g < g0 + nc; ++g) {
        int64_t r0 = 0;
        for (; r0 + 4 <= t.n_rows; r0 += 4) tile_avx2<4>(t, g, r0, o_end);
        switch (t.n_rows - r0) {
          case 1:
            tile_avx2<1>(t, g, r0, o_end);
            break;
          case 2:
            tile_avx2<2>(t, g, r0, o_end);
            break;
          case 3:
            tile_avx2<3>(t, g, r0, o_end);
            break;
          default:
            break;
        }
      }
    }
    g0 += nc;
  }
}

METRALE_BF16_TARGET void round_rows(ConstRows x, int64_t r_begin, int64_t r_end, uint16_t* out) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i inf = _mm512_set1_epi32(0x7F800000);
  const __m512i half = _mm512_set1_epi32(0x7FFF);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i nan = _mm512_set1_epi32(0x7FC0);
  const int64_t n = x.n_cols;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* src = x.row(r);
    uint16_t* dst = out + r * n;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512i b = _mm512_castps_si512(_mm512_loadu_ps(src + i));
      const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, abs_mask), inf);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), one);
      __m512i h = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, half), lsb), 16);
      h = _mm512_mask_blend_epi32(is_nan, h, nan);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(h));
    }
    for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  }
}

bool cpu_has(bool native) {
  __builtin_cpu_init();
  const bool base = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl");
  return base && (!native || __builtin_cpu_supports("avx512bf16"));
}

}  // namespace

bool pairs_bf16_avx2() {
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return avx2;
}

bool pairs_bf16_simd() {
  static const bool simd = cpu_has(false);
  return simd;
}

bool pairs_bf16_native() {
  static const bool native = cpu_has(true);
  return native;
}
#else
bool pairs_bf16_avx2() { return false; }
bool pairs_bf16_simd() { return false; }
bool pairs_bf16_native() { return false; }
#endif

namespace {

void round_rows_scalar(ConstRows x, int64_t r_begin, int64_t r_end, uint16_t* out) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    for (int64_t i = 0; i < x.n_cols; ++i) out[r * x.n_cols + i] = f32_to_bf16(x.row(r)[i]);
  }
}

// The order of linear_pairs.h as plain code. Each product of two bf16 values is exact in
// f32, so a compiler contracting `acc + a * b` into an FMA would not change a bit either.
void linear_pairs_scalar(const PairsTask& t, int64_t o_begin, int64_t o_end) {
  const int64_t n_pairs = t.n_in / 2;
  for (int64_t r = 0; r < t.n_rows; ++r) {
    const uint16_t* x = t.x + r * t.n_in;
    float* y = t.y.row(r);
    for (int64_t o = o_begin; o < o_end; ++o) {
      const uint16_t* w = t.w + line_offset(n_pairs, o / kGroup, 0) + (o % kGroup) * 2;
      float acc = 0.0f;
      for (int64_t p = 0; p < n_pairs; ++p, w += kLineStride) {
        acc += bf16_to_f32(x[2 * p + 1]) * bf16_to_f32(w[1]);
        acc += bf16_to_f32(x[2 * p]) * bf16_to_f32(w[0]);
      }
      y[o] = t.bias != nullptr ? acc + t.bias[o] : acc;
    }
  }
}

}  // namespace

void round_rows_bf16(ConstRows x, int64_t r_begin, int64_t r_end, uint16_t* out) {
#if defined(__x86_64__)
  if (pairs_bf16_simd()) return round_rows(x, r_begin, r_end, out);
#endif
  round_rows_scalar(x, r_begin, r_end, out);
}

void linear_bf16_pairs(const PairsTask& t, int64_t o_begin, int64_t o_end, PairsPath path) {
#if defined(__x86_64__)
  const bool any = path == PairsPath::kAuto;
  if (any && pairs_bf16_native()) return linear_pairs<true>(t, o_begin, o_end);
  if ((any || path == PairsPath::kAvx512F) && pairs_bf16_simd())
    return linear_pairs<false>(t, o_begin, o_end);
  if ((any || path == PairsPath::kAvx2) && pairs_bf16_avx2())
    return linear_pairs_avx2(t, o_begin, o_end);
#endif
  METRALE_CHECK(path != PairsPath::kAvx512F, "linear_bf16_pairs: this CPU has no AVX-512");
  METRALE_CHECK(path != PairsPath::kAvx2, "linear_bf16_pairs: this CPU has no AVX2/FMA");
  linear_pairs_scalar(t, o_begin, o_end);
}

}  // namespace metrale::cpu
