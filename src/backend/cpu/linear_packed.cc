// The packed bf16 linear kernel (layout and summation order in linear_packed.h). Written
// with AVX-512 intrinsics in functions compiled for that target and chosen at run time:
// Highway 1.0.3's dynamic dispatch would do too, but the bit tricks below (shift / mask to
// widen two bf16 halves of a lane) are plain integer ops that read most clearly as
// intrinsics, and the whole file is one target.
#include "backend/cpu/linear_packed.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backend/cpu/cpu_features.h"

#if defined(__x86_64__)
// g++ 12's AVX-512 headers build some results from _mm512_undefined_*() (`__Y = __Y`), which
// -Wmaybe-uninitialized reports at every use: a known header false positive.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define METRALE_AVX512 __attribute__((target("avx512f,avx512bw")))
// The tile loops must unroll completely so the accumulators stay in registers (-O2 does not
// unroll them by itself and would keep them in memory).
#define METRALE_UNROLL _Pragma("GCC unroll 16")
#endif

namespace metrale::cpu {

size_t packed_bf16_bytes(int64_t n_out, int64_t n_in) {
  const int64_t groups = (n_out + kPackRows - 1) / kPackRows;
  return static_cast<size_t>(groups * kPackRows * n_in) * sizeof(uint16_t);
}

namespace {

// Index of w[row][k] inside the packed array.
inline size_t packed_index(int64_t n_in, int64_t row, int64_t k) {
  const int64_t kb = n_in / kPackK;
  const int64_t g = row / kPackRows, r = row % kPackRows, b = k / kPackK, kk = k % kPackK;
  const int64_t lane = kk % 16, half = kk / 16;
  return static_cast<size_t>((((g * kb + b) * kPackRows + r) * kPackK) + 2 * lane + half);
}

}  // namespace

void pack_bf16(const uint16_t* src, int64_t n_out, int64_t n_in, uint16_t* dst) {
  std::memset(dst, 0, packed_bf16_bytes(n_out, n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    const uint16_t* row = src + o * n_in;
    for (int64_t k = 0; k < n_in; ++k) dst[packed_index(n_in, o, k)] = row[k];
  }
}

void unpack_bf16_row(const uint16_t* packed, int64_t n_in, int64_t row, float* out) {
  for (int64_t k = 0; k < n_in; ++k) {
    const uint32_t bits = static_cast<uint32_t>(packed[packed_index(n_in, row, k)]) << 16;
    std::memcpy(out + k, &bits, sizeof(float));
  }
}

#if defined(__x86_64__)
namespace {

// acc[r][c] over every K block for x rows [0, R) and group rows [c0, c0 + C); then the
// horizontal sums (+ bias) into y[r][c0 + c] for the rows below `valid`.
template <int R, int C>
METRALE_AVX512 void Tile(const float* const* x, const uint16_t* group, int64_t c0, int64_t kb,
                         const float* bias, float* const* y, int64_t valid) {
  __m512 acc[R][C];
  METRALE_UNROLL for (int r = 0; r < R; ++r) METRALE_UNROLL for (int c = 0; c < C; ++c) acc[r][c] =
      _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t b = 0; b < kb; ++b) {
    const uint16_t* line = group + (b * kPackRows + c0) * kPackK;
    __m512 xl[R], xh[R];
    METRALE_UNROLL for (int r = 0; r < R; ++r) {
      xl[r] = _mm512_loadu_ps(x[r] + b * kPackK);
      xh[r] = _mm512_loadu_ps(x[r] + b * kPackK + 16);
    }
    METRALE_UNROLL for (int c = 0; c < C; ++c) {
      const __m512i v = _mm512_load_si512(line + c * kPackK);
      const __m512 wl = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      const __m512 wh = _mm512_castsi512_ps(_mm512_and_si512(v, high));
      METRALE_UNROLL for (int r = 0; r < R; ++r) {
        acc[r][c] = _mm512_fmadd_ps(xl[r], wl, acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(xh[r], wh, acc[r][c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    if (c0 + c >= valid) break;
    const float add = bias != nullptr ? bias[c0 + c] : 0.0f;
    for (int r = 0; r < R; ++r) {
      float s = _mm512_reduce_add_ps(acc[r][c]);
      if (bias != nullptr) s += add;
      y[r][c0 + c] = s;
    }
  }
}

// x rows [r0, r0 + R) against one group: one pass of 16 columns for a single row (a
// sequential read of the group; software prefetch measured no gain over the hardware
// prefetcher), otherwise four passes of 4 columns (the group, 16 rows x n_in bf16 = 96 KiB
// at n_in 3072, is re-read from L2).
template <int R>
METRALE_AVX512 void GroupRows(const LinearTask& t, const uint16_t* group, int64_t g, int64_t kb,
                              int64_t r0, int64_t valid) {
  const float* x[R];
  float* y[R];
  for (int r = 0; r < R; ++r) {
    x[r] = t.x.row(r0 + r);
    y[r] = t.y.row(r0 + r) + g * kPackRows;
  }
  const float* bias = t.bias != nullptr ? t.bias + g * kPackRows : nullptr;
  if constexpr (R == 1) {
    Tile<1, 16>(x, group, 0, kb, bias, y, valid);
  } else {
    for (int64_t c0 = 0; c0 < kPackRows && c0 < valid; c0 += 4)
      Tile<R, 4>(x, group, c0, kb, bias, y, valid);
  }
}

METRALE_AVX512 void LinearPacked(const LinearTask& t, int64_t o_begin, int64_t o_end) {
  const int64_t kb = t.n_in / kPackK;
  const auto* w = static_cast<const uint16_t*>(t.w);
  const int64_t rows = t.x.n_rows;
  for (int64_t g = o_begin / kPackRows; g * kPackRows < o_end; ++g) {
    const uint16_t* group = w + g * kb * kPackRows * kPackK;
    const int64_t valid = std::min(kPackRows, o_end - g * kPackRows);
    int64_t r0 = 0;
    for (; r0 + 4 <= rows; r0 += 4) GroupRows<4>(t, group, g, kb, r0, valid);
    switch (rows - r0) {
      case 1:
        GroupRows<1>(t, group, g, kb, r0, valid);
        break;
      case 2:
        GroupRows<2>(t, group, g, kb, r0, valid);
        break;
      case 3:
        GroupRows<3>(t, group, g, kb, r0, valid);
        break;
      default:
        break;
    }
  }
}

}  // namespace

bool packed_bf16_enabled() {
  static const bool enabled = cpu_pack_allowed() && cpu_has_avx512();
  return enabled;
}

void linear_bf16_packed(const LinearTask& t, int64_t o_begin, int64_t o_end) {
  LinearPacked(t, o_begin, o_end);
}

#else  // not x86-64: never packed

bool packed_bf16_enabled() { return false; }
void linear_bf16_packed(const LinearTask&, int64_t, int64_t) { std::abort(); }

#endif

}  // namespace metrale::cpu
