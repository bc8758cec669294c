// q8 layouts (linear_quant.h, "Q8 layouts"): the AVX-512 VNNI kernel and the input
// quantization. The portable twins (linear_quant_pack.cc) compute the same bits.
//
// Per 32 weights of one output row the kernel issues one vpdpbusd per 4 positions across 16
// rows at once (lanes = rows, so no horizontal sums), plus 1.5 bit ops per 4-bit line and 3 f32
// ops per block per input row to apply the offsets and scales: about a tenth of the f32 layouts'
// work per weight, so a decode step streams 4-bit weights at the memory's pace instead of the
// cores'. With more than one input row the decoded block is reused for up to 4 rows.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear_quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define METRALE_Q8_SIMD 1
// g++ 12's AVX-512 headers trip -Wmaybe-uninitialized (see linear_quant.cc).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif

namespace metrale::cpu {

#ifdef METRALE_Q8_SIMD
#define METRALE_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define METRALE_VNNI_INLINE \
  inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni")))
#define METRALE_UNROLL _Pragma("GCC unroll 16")

namespace {

// Prefetch distance along a tile's stream of codes (as the f32 layouts' GEMV).
constexpr int64_t kPrefetchAhead = 2048;

// The unsigned codes of one block as 8 vectors, vector k against input dword k (positions
// 4k..4k+3), lane c = tile row c.
struct Int4Codes {
  static constexpr int64_t kBlockBytes = 256;
  METRALE_VNNI_INLINE static void decode(const uint8_t* block, __m512i (&u)[8]) {
    const __m512i m = _mm512_set1_epi8(0x0F);
    METRALE_UNROLL for (int line = 0; line < 4; ++line) {
      const __m512i v = _mm512_loadu_si512(block + 64 * line);
      u[2 * line] = _mm512_and_si512(v, m);
      u[2 * line + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
    }
  }
};

struct Nvfp4Codes {
  static constexpr int64_t kBlockBytes = 256;
  METRALE_VNNI_INLINE static void decode(const uint8_t* block, __m512i (&u)[8]) {
    Int4Codes::decode(block, u);
    const __m512i lut =
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kQ8Nvfp4Codes)));
    METRALE_UNROLL for (int k = 0; k < 8; ++k) u[k] = _mm512_shuffle_epi8(lut, u[k]);
  }
};

struct Int8Codes {
  static constexpr int64_t kBlockBytes = 512;
  METRALE_VNNI_INLINE static void decode(const uint8_t* block, __m512i (&u)[8]) {
    METRALE_UNROLL for (int k = 0; k < 8; ++k) u[k] = _mm512_loadu_si512(block + 64 * k);
  }
};

// A slot's 16 scales and offsets.
struct Slot {
  __m512 s, off;
};
template <bool kAsym, bool kE4m3>
METRALE_VNNI_INLINE Slot LoadSlot(const QuantLayout& l, const uint8_t* slot, float off) {
  Slot v;
  if constexpr (kE4m3) {
    // e4m3 -> f16 bits = e4m3 / 256 (linear_quant_pack.cc: e4m3_as_f16), then * q8_scale.
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(slot)));
    const __m256i h =
        _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
    v.s = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(l.q8_scale));
  } else {
    v.s = _mm512_loadu_ps(reinterpret_cast<const float*>(slot));
  }
  v.off = kAsym ? _mm512_loadu_ps(reinterpret_cast<const float*>(slot + 64)) : _mm512_set1_ps(off);
  return v;
}

// sum over dwords [k0, k1) of u[k] * x's dword k, as int32 lanes (two chains, then added:
// integer sums are exact in any order).
template <int K0, int K1>
METRALE_VNNI_INLINE __m512i Dot(const __m512i (&u)[8], const int32_t* x) {
  __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
  METRALE_UNROLL for (int k = K0; k < K1; k += 2) {
    a = _mm512_dpbusd_epi32(a, u[k], _mm512_set1_epi32(x[k]));
    b = _mm512_dpbusd_epi32(b, u[k + 1], _mm512_set1_epi32(x[k + 1]));
  }
  return _mm512_add_epi32(a, b);
}

// T = float(I) - off * s (exact), then fma(T, d, g).
METRALE_VNNI_INLINE __m512 Combine(__m512i i, __m512 off, float s, float d, __m512 g) {
  const __m512 t = _mm512_fnmadd_ps(off, _mm512_set1_ps(s), _mm512_cvtepi32_ps(i));
  return _mm512_fmadd_ps(t, _mm512_set1_ps(d), g);
}

// Input rows [0, R) (x: their q8 rows) against one tile; y[r] = its 16 outputs (valid of them).
template <class Codes, bool kAsym, bool kE4m3, int R>
METRALE_VNNI void TileRows(const QuantLayout& l, const uint8_t* tile, float off,
                           const uint8_t* const* x, const float* bias, float* const* y,
                           int64_t valid) {
  const Q8Block* xb[R];
  METRALE_UNROLL for (int r = 0; r < R; ++r) xb[r] = reinterpret_cast<const Q8Block*>(x[r] + l.kp);
  __m512 acc[R];
  METRALE_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const QuantSegment* segs = l.segment_table();
  __m512i u[8];
  for (int64_t i = 0; i < l.n_segments; ++i) {
    const QuantSegment& s = segs[i];
    const uint8_t* block = tile + s.codes;
    if (l.per_half) {  // one block, a slot per half
      const Slot lo = LoadSlot<kAsym, kE4m3>(l, tile + s.slot_lo, off);
      const Slot hi = LoadSlot<kAsym, kE4m3>(l, tile + s.slot_hi, off);
      Codes::decode(block, u);
      const int64_t b = s.block_begin;
      METRALE_UNROLL for (int r = 0; r < R; ++r) {
        const auto* xd = reinterpret_cast<const int32_t*>(x[r] + b * kQuantK);
        const Q8Block& q = xb[r][b];
        const __m512 g_lo = Combine(Dot<0, 4>(u, xd), lo.off, q.s_lo, q.d, _mm512_setzero_ps());
        const __m512 g_hi = Combine(Dot<4, 8>(u, xd), hi.off, q.s_hi, q.d, _mm512_setzero_ps());
        acc[r] = _mm512_fmadd_ps(g_lo, lo.s, acc[r]);
        acc[r] = _mm512_fmadd_ps(g_hi, hi.s, acc[r]);
      }
      continue;
    }
    const Slot slot = LoadSlot<kAsym, kE4m3>(l, tile + s.slot_lo, off);
    __m512 g[R];
    METRALE_UNROLL for (int r = 0; r < R; ++r) g[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < s.n_blocks; ++k, block += Codes::kBlockBytes) {
      for (int64_t line = 0; line < Codes::kBlockBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchAhead + line, _MM_HINT_T0);
      Codes::decode(block, u);
      const int64_t b = s.block_begin + k;
      METRALE_UNROLL for (int r = 0; r < R; ++r) {
        const auto* xd = reinterpret_cast<const int32_t*>(x[r] + b * kQuantK);
        const Q8Block& q = xb[r][b];
        g[r] = Combine(Dot<0, 8>(u, xd), slot.off, q.s, q.d, g[r]);
      }
    }
    METRALE_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(g[r], slot.s, acc[r]);
  }
  const auto mask = static_cast<__mmask16>((1u << valid) - 1u);
  METRALE_UNROLL for (int r = 0; r < R; ++r) {
    __m512 v = acc[r];
    if (bias != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias));
    _mm512_mask_storeu_ps(y[r], mask, v);
  }
}

constexpr int kMaxRows = 4;  // input rows per pass over a tile

template <class Codes, bool kAsym, bool kE4m3>
METRALE_VNNI void Run(const QuantTask& t, int64_t o_begin, int64_t o_end, float off) {
  const QuantLayout& l = *t.w;
  const int64_t stride = q8_row_bytes(l.kp);
  for (int64_t g = o_begin / kQuantRows; g * kQuantRows < o_end; ++g) {
    const uint8_t* tile = l.tile(g);
    const int64_t valid = std::min(kQuantRows, o_end - g * kQuantRows);
    const float* bias = t.bias != nullptr ? t.bias + g * kQuantRows : nullptr;
    for (int64_t r0 = 0; r0 < t.x.n_rows; r0 += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, t.x.n_rows - r0));
      const uint8_t* x[kMaxRows];
      float* y[kMaxRows];
      for (int r = 0; r < rows; ++r) {
        x[r] = t.x8 + (r0 + r) * stride;
        y[r] = t.y.row(r0 + r) + g * kQuantRows;
      }
      switch (rows) {
        case 1:
          TileRows<Codes, kAsym, kE4m3, 1>(l, tile, off, x, bias, y, valid);
          break;
        case 2:
          TileRows<Codes, kAsym, kE4m3, 2>(l, tile, off, x, bias, y, valid);
          break;
        case 3:
          TileRows<Codes, kAsym, kE4m3, 3>(l, tile, off, x, bias, y, valid);
          break;
        default:
          TileRows<Codes, kAsym, kE4m3, 4>(l, tile, off, x, bias, y, valid);
          break;
      }
    }
  }
}

METRALE_VNNI void LinearQ8(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  const QuantLayout& l = *t.w;
  switch (l.format) {
    case WeightFormat::kInt4:
      if (l.asymmetric) return Run<Int4Codes, true, false>(t, o_begin, o_end, 0.0f);
      return Run<Int4Codes, false, false>(t, o_begin, o_end, 8.0f);
    case WeightFormat::kInt8:
      if (l.asymmetric) return Run<Int8Codes, true, false>(t, o_begin, o_end, 0.0f);
      return Run<Int8Codes, false, false>(t, o_begin, o_end, 128.0f);
    case WeightFormat::kNvfp4:
      if (l.e4m3_slots) return Run<Nvfp4Codes, false, true>(t, o_begin, o_end, 12.0f);
      return Run<Nvfp4Codes, false, false>(t, o_begin, o_end, 12.0f);
    default:
      std::abort();  // pack_quant makes q8 layouts of these formats only
  }
}

METRALE_VNNI void QuantizeRows(const QuantLayout& l, ConstRows x, int64_t r_begin, int64_t r_end,
                               void* out) {
  const int32_t* perm = l.permutation();
  const int64_t stride = q8_row_bytes(l.kp);
  alignas(64) float gathered[kQuantK];
  const __m512 big = _mm512_set1_ps(FLT_MAX);
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* src = x.row(r);
    auto* q = static_cast<uint8_t*>(out) + r * stride;
    auto* blocks = reinterpret_cast<Q8Block*>(q + l.kp);
    for (int64_t b = 0; b < l.kp / kQuantK; ++b) {
      const float* v = src + b * kQuantK;
      if (perm != nullptr) {
        for (int64_t j = 0; j < kQuantK; ++j) {
          const int32_t col = perm[b * kQuantK + j];
          gathered[j] = col >= 0 ? src[col] : 0.0f;
        }
        v = gathered;
      }
      const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
      const __m512 alo = _mm512_abs_ps(lo), ahi = _mm512_abs_ps(hi);
      // Ordered <= FLT_MAX is false for NaN and infinities.
      const bool finite = (_mm512_cmp_ps_mask(alo, big, _CMP_LE_OQ) &
                           _mm512_cmp_ps_mask(ahi, big, _CMP_LE_OQ)) == 0xFFFF;
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(alo, ahi));
      Q8Block& qb = blocks[b];
      if (!finite || amax == 0.0f) {
        std::fill_n(q + b * kQuantK, kQuantK, uint8_t{0});
        qb = {finite ? 0.0f : std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f, 0.0f};
        continue;
      }
      const __m512 id = _mm512_set1_ps(127.0f / amax);
      // cvtps rounds to nearest even (the default MXCSR), as nearbyint does.
      const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id));
      const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQuantK), _mm512_cvtepi32_epi8(qlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQuantK + 16), _mm512_cvtepi32_epi8(qhi));
      const int32_t s_lo = _mm512_reduce_add_epi32(qlo), s_hi = _mm512_reduce_add_epi32(qhi);
      qb = {amax / 127.0f, static_cast<float>(s_lo + s_hi), static_cast<float>(s_lo),
            static_cast<float>(s_hi)};
    }
  }
}

}  // namespace

bool q8_simd_enabled() {
  static const bool enabled = cpu_pack_allowed() && cpu_has_avx512(/*vnni=*/true);
  return enabled;
}

void linear_q8_avx512(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  LinearQ8(t, o_begin, o_end);
}

void quantize_q8_rows_avx512(const QuantLayout& l, ConstRows x, int64_t r_begin, int64_t r_end,
                             void* out) {
  QuantizeRows(l, x, r_begin, r_end, out);
}

#else  // not x86-64: the portable kernel only

bool q8_simd_enabled() { return false; }
void linear_q8_avx512(const QuantTask&, int64_t, int64_t) { std::abort(); }
void quantize_q8_rows_avx512(const QuantLayout&, ConstRows, int64_t, int64_t, void*) {
  std::abort();
}

#endif

}  // namespace metrale::cpu
