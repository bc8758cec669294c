// The AVX-512 quantized linear kernels (layout and summation order in linear_quant.h), and the
// run-time choice between them and the portable kernel. Intrinsics in functions compiled for
// AVX-512 F+BW, like linear_packed.cc: the decode is byte shuffling (nibble lookups, the e4m3
// -> f16 shift) that reads most clearly as intrinsics.
//
// GEMV (up to 4 rows): a tile's 16 weight rows are decoded block by block straight into
// registers and multiplied into R x C accumulators (R x rows, C weight rows: 1 x 16, 2 x 8, 3 x
// 4, 4 x 4), so each weight byte is read and decoded once per call. GEMM (more rows): the tile
// is decoded one K slice (256 positions) at a time into an f32 scratch, and 4 x 4 register
// tiles run over it for a block of up to 64 rows, whose accumulators wait in a per-thread
// scratch between slices; a weight byte is decoded once per 64 rows. Both keep one 16-lane
// accumulator per output and feed it the same FMAs in the same order.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear_quant.h"

#if defined(__x86_64__)
// g++ 12's AVX-512 headers build some results from _mm512_undefined_*() (`__Y = __Y`), which
// -Wmaybe-uninitialized (and, in functions not inlined, -Wuninitialized) reports at every use:
// a known header false positive.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#define METRALE_AVX512 __attribute__((target("avx512f,avx512bw")))
// The per-block helpers must inline into their loops (a call would put the accumulators in
// memory); GCC declines on its own once a helper has two call sites.
#define METRALE_AVX512_INLINE inline __attribute__((always_inline, target("avx512f,avx512bw")))
// The tile loops must unroll completely so the accumulators stay in registers.
#define METRALE_UNROLL _Pragma("GCC unroll 16")
#endif

namespace metrale::cpu {

#if defined(__x86_64__)
namespace {

// 16 fp8 e4m3 codes -> f32 values / 256: sign-extended to 16 bits and shifted left by 7, the
// sign lands in bit 15 and exponent + mantissa in bits 13..7 (bit 14, a copy of the sign, is
// cleared), which read as f16 is the e4m3 value / 256 (linear_quant_pack.cc: e4m3_as_f16).
METRALE_AVX512_INLINE __m512 E4m3Div256(const uint8_t* p) {
  const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i h =
      _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
  return _mm512_cvtph_ps(h);
}

// The same pointer, hidden from the optimiser. The decoders read per-row tables and scales that
// do not change within a segment; GCC hoists every such load it can see out of the block loop
// into a register, and 16 rows' worth leaves no room for the accumulators, which it then
// spills (a load and a store per FMA chain per block; which ones it spills changed with
// unrelated edits). Loads through an opaque pointer stay in the loop as memory operands. The
// decoders use it for everything but the tables their caller lets stay in registers (GemvRow).
template <class T>
inline const T* Opaque(const T* p) {
  asm("" : "+r"(p));
  return p;
}

// The lanes of a summed in the fixed tree of linear_quant.h.
METRALE_AVX512 inline float Reduce(__m512 a) {
  __m512 h = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(1, 0, 3, 2)));  // i + 8
  h = _mm512_add_ps(h, _mm512_shuffle_f32x4(h, h, _MM_SHUFFLE(2, 3, 0, 1)));         // i + 4
  h = _mm512_add_ps(h, _mm512_permute_ps(h, _MM_SHUFFLE(1, 0, 3, 2)));               // i + 2
  h = _mm512_add_ps(h, _mm512_permute_ps(h, _MM_SHUFFLE(2, 3, 0, 1)));               // i + 1
  return _mm512_cvtss_f32(h);
}

// The f32 scales (and zero points) of a segment's slots, read in place: the tile's 16 rows.
template <bool kAsym>
struct Slots {
  const float* s_lo = nullptr;
  const float* s_hi = nullptr;
  const float* z_lo = nullptr;
  const float* z_hi = nullptr;

  void load(const uint8_t* tile, const QuantSegment& seg) {
    s_lo = reinterpret_cast<const float*>(tile + seg.slot_lo);
    s_hi = reinterpret_cast<const float*>(tile + seg.slot_hi);
    if constexpr (kAsym) {
      z_lo = s_lo + 16;
      z_hi = s_hi + 16;
    }
  }
};

// Decoders: begin() once per segment (and per GEMM slice); then, for tile rows [c, c + 4) (c a
// multiple of 4) of a block, line() reads what the four rows share (for 4-bit codes, their
// 64-byte line) and row<J>() turns row c + J's codes into two f32 vectors (positions 0-15,
// 16-31). One row at a time keeps two decoded vectors live, not eight. `block` is the block's
// first byte.

// The indices of 4-bit codes in a line of four rows: vpermps reads the low 4 bits of each
// index lane, so row J's low nibbles (byte J of every dword) are the index after a shift by
// 8 J, its high nibbles after 8 J + 4.
template <int J>
METRALE_AVX512_INLINE void NibbleIndices(__m512i line, __m512i& lo, __m512i& hi) {
  lo = J == 0 ? line : _mm512_srli_epi32(line, 8 * J);
  hi = _mm512_srli_epi32(line, 8 * J + 4);
}

// 4-bit codes (int4, nvfp4) with f32 scales, looked up in a 16-entry table of their unscaled
// values `Base`. kTable: per segment, per row, a table of already-scaled values (Base - z) * s,
// so decode is one permute per 16 weights. Otherwise (per-half layout: a new scale every 16
// weights) the unscaled value is looked up and scaled per half: the same f32 product.
template <class Base, bool kAsym, bool kTable>
struct NibbleDecoder {
  static constexpr int64_t kRowBytes = 16;
  using Line = __m512i;  // four rows' codes (linear_quant.h)
  Slots<kAsym> slots;
  alignas(64) float table[16][16];

  METRALE_AVX512 void begin(const QuantLayout&, const uint8_t* tile, const QuantSegment& seg,
                            int c0, int n_cols) {
    slots.load(tile, seg);
    if constexpr (kTable) {
      const __m512 base = Base::values();
      for (int c = c0; c < c0 + n_cols; ++c) {
        __m512 v = base;
        if constexpr (kAsym) v = _mm512_sub_ps(v, _mm512_set1_ps(slots.z_lo[c]));
        _mm512_store_ps(table[c], _mm512_mul_ps(v, _mm512_set1_ps(slots.s_lo[c])));
      }
    }
  }

  template <int J, int kKeep>
  METRALE_AVX512_INLINE void row(Line line, int c, __m512& lo, __m512& hi) const {
    __m512i il, ih;
    NibbleIndices<J>(line, il, ih);
    if constexpr (kTable) {
      // Rows below kKeep may keep their tables in registers across a segment's blocks, the
      // others load theirs per block (see Opaque).
      const float* t_row = c + J < kKeep ? table[c + J] : Opaque(table[c + J]);
      const __m512 t = _mm512_load_ps(t_row);
      lo = _mm512_permutexvar_ps(il, t);
      hi = _mm512_permutexvar_ps(ih, t);
    } else {
      const __m512 base = Base::values();
      lo = _mm512_permutexvar_ps(il, base);
      hi = _mm512_permutexvar_ps(ih, base);
      if constexpr (kAsym) {
        lo = _mm512_sub_ps(lo, _mm512_set1_ps(Opaque(slots.z_lo)[c + J]));
        hi = _mm512_sub_ps(hi, _mm512_set1_ps(Opaque(slots.z_hi)[c + J]));
      }
      lo = _mm512_mul_ps(lo, _mm512_set1_ps(Opaque(slots.s_lo)[c + J]));
      hi = _mm512_mul_ps(hi, _mm512_set1_ps(Opaque(slots.s_hi)[c + J]));
    }
  }

  METRALE_AVX512_INLINE Line line(const uint8_t* block, int c) const {
    return _mm512_loadu_si512(block + (c / 4) * 64);
  }
};

// NVFP4 with e4m3 scales: the 16-entry table of a row's half is the row of the weight's scale
// tables picked by its scale byte (QuantLayout::tables), so decode is one permute per 16
// weights in either layout and the scales stay one byte each.
struct E4m3NibbleDecoder {
  static constexpr int64_t kRowBytes = 16;
  using Line = __m512i;
  const float* tables = nullptr;
  const uint8_t* code_lo = nullptr;
  const uint8_t* code_hi = nullptr;

  // A layer's tables are cold when its call starts (each weight has its own, 16 KB, read in
  // scale-code order): fetching them all up front beats one miss after another (weights from
  // DRAM, 2 threads: -10%). (Prefetching the codes themselves made the GEMV slower.)
  static void warm(const QuantLayout& l) {
    const auto* p = reinterpret_cast<const char*>(l.scale_tables());
    for (int64_t i = 0; i < 256 * 16 * 4; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
  }

  void begin(const QuantLayout& l, const uint8_t* tile, const QuantSegment& seg, int, int) {
    tables = l.scale_tables();
    code_lo = tile + seg.slot_lo;
    code_hi = tile + seg.slot_hi;
  }

  template <int J, int kKeep>
  METRALE_AVX512_INLINE void row(Line line, int c, __m512& lo, __m512& hi) const {
    __m512i il, ih;
    NibbleIndices<J>(line, il, ih);
    const float* t = Opaque(tables);
    lo = _mm512_permutexvar_ps(il, _mm512_load_ps(t + 16 * code_lo[c + J]));
    hi = _mm512_permutexvar_ps(ih, _mm512_load_ps(t + 16 * code_hi[c + J]));
  }

  METRALE_AVX512_INLINE Line line(const uint8_t* block, int c) const {
    return _mm512_loadu_si512(block + (c / 4) * 64);
  }
};

struct Int4Values {  // nibble i stores q = i - 8
  METRALE_AVX512 static __m512 values() {
    return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  }
};
struct E2m1Values {  // core/dtype e2m1_to_f32 of every nibble
  METRALE_AVX512 static __m512 values() {
    return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                          -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  }
};

// What the 8-bit decoders share: rows of 32 one-byte codes, and the segment's slots.
template <bool kAsym>
struct ByteRows {
  static constexpr int64_t kRowBytes = 32;
  Slots<kAsym> slots;

  void begin(const QuantLayout&, const uint8_t* tile, const QuantSegment& seg, int, int) {
    slots.load(tile, seg);
  }
  using Line = const uint8_t*;  // row c's codes
  Line line(const uint8_t* block, int c) const { return block + c * kRowBytes; }
};

// int8: (float(q) - z) * s.
template <bool kAsym>
struct Int8Decoder : ByteRows<kAsym> {
  using typename ByteRows<kAsym>::Line;
  using ByteRows<kAsym>::kRowBytes;
  using ByteRows<kAsym>::slots;
  template <int J, int kKeep>
  METRALE_AVX512_INLINE void row(Line line, int c, __m512& lo, __m512& hi) const {
    const uint8_t* codes = line + J * kRowBytes;
    lo = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
    hi = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16))));
    if constexpr (kAsym) {
      lo = _mm512_sub_ps(lo, _mm512_set1_ps(Opaque(slots.z_lo)[c + J]));
      hi = _mm512_sub_ps(hi, _mm512_set1_ps(Opaque(slots.z_hi)[c + J]));
    }
    lo = _mm512_mul_ps(lo, _mm512_set1_ps(Opaque(slots.s_lo)[c + J]));
    hi = _mm512_mul_ps(hi, _mm512_set1_ps(Opaque(slots.s_hi)[c + J]));
  }
};

// fp8 e4m3: (e4m3 / 256) * (s * 256), the slot holding s * 256.
struct Fp8Decoder : ByteRows<false> {
  template <int J, int kKeep>
  METRALE_AVX512_INLINE void row(Line line, int c, __m512& lo, __m512& hi) const {
    const uint8_t* codes = line + J * kRowBytes;
    lo = _mm512_mul_ps(E4m3Div256(codes), _mm512_set1_ps(Opaque(slots.s_lo)[c + J]));
    hi = _mm512_mul_ps(E4m3Div256(codes + 16), _mm512_set1_ps(Opaque(slots.s_hi)[c + J]));
  }
};

// Row c + J of a GEMV block: decoded, then into its R accumulators. Per-row tables that may
// stay in registers (row<J, kKeep>): with one x row, 16 accumulators + 8 tables fill the 32
// registers (all 16 would push accumulators out, a load and a store each per block; none costs
// 15% in load bandwidth); with more x rows the accumulators and x vectors need the room.
template <class D, int R, int C, int J>
METRALE_AVX512_INLINE void GemvRow(const D& dec, typename D::Line line, int c0, int c,
                                   const __m512 (&xl)[R], const __m512 (&xh)[R],
                                   __m512 (&acc)[R][C]) {
  __m512 wl, wh;
  dec.template row<J, R == 1 ? 8 : 0>(line, c0 + c, wl, wh);
  METRALE_UNROLL for (int r = 0; r < R; ++r) {
    acc[r][c + J] = _mm512_fmadd_ps(xl[r], wl, acc[r][c + J]);
    acc[r][c + J] = _mm512_fmadd_ps(xh[r], wh, acc[r][c + J]);
  }
}

// The GEMV reads each tile as one stream but, being compute-bound, leaves the hardware
// prefetchers behind at DRAM latency now and then; each line of codes is prefetched this far
// ahead (nvfp4 from DRAM, 2 threads: 110 -> 90 us at [1024, 3072]; int4 within noise).
constexpr int64_t kPrefetchAhead = 2048;

// One block of the GEMV: x rows at the block's inputs, tile rows [c0, c0 + C).
template <class D, int R, int C>
METRALE_AVX512_INLINE void GemvBlock(const D& dec, const uint8_t* block, const float* const* x,
                                     int64_t k, int c0, __m512 (&acc)[R][C]) {
  __m512 xl[R], xh[R];
  METRALE_UNROLL for (int r = 0; r < R; ++r) {
    xl[r] = _mm512_loadu_ps(x[r] + k);
    xh[r] = _mm512_loadu_ps(x[r] + k + 16);
  }
  METRALE_UNROLL for (int c = 0; c < C; c += 4) {
    const char* ahead = reinterpret_cast<const char*>(block) + (c0 + c) * D::kRowBytes;
    for (int64_t l = 0; l < 4 * D::kRowBytes; l += 64)
      _mm_prefetch(ahead + kPrefetchAhead + l, _MM_HINT_T0);
    const typename D::Line line = dec.line(block, c0 + c);
    GemvRow<D, R, C, 0>(dec, line, c0, c, xl, xh, acc);
    GemvRow<D, R, C, 1>(dec, line, c0, c, xl, xh, acc);
    GemvRow<D, R, C, 2>(dec, line, c0, c, xl, xh, acc);
    GemvRow<D, R, C, 3>(dec, line, c0, c, xl, xh, acc);
  }
}

// GEMV: x rows [0, R) (already in packed order) against tile rows [c0, c0 + C), all of K,
// accumulators in registers; then y[r][c0 + c] for the rows below `valid`.
template <class D, int R, int C>
METRALE_AVX512 void GemvTile(const QuantLayout& l, const uint8_t* tile, const float* const* x,
                             int c0, const float* bias, float* const* y, int64_t valid) {
  __m512 acc[R][C];
  METRALE_UNROLL for (int r = 0; r < R; ++r) METRALE_UNROLL for (int c = 0; c < C; ++c) acc[r][c] =
      _mm512_setzero_ps();
  D dec;
  const QuantSegment* segs = l.segment_table();
  for (int64_t i = 0; i < l.n_segments; ++i) {
    const QuantSegment& s = segs[i];
    dec.begin(l, tile, s, c0, C);
    const uint8_t* block = tile + s.codes;
    const int64_t k = static_cast<int64_t>(s.block_begin) * kQuantK;
    if (s.n_blocks == 1) {
      // (Per-half segments: no loop, so nothing per row gets hoisted out of one and spilled.)
      GemvBlock<D, R, C>(dec, block, x, k, c0, acc);
      continue;
    }
    for (int64_t b = 0; b < s.n_blocks; ++b) {
      GemvBlock<D, R, C>(dec, block + b * kQuantRows * D::kRowBytes, x, k + b * kQuantK, c0, acc);
    }
  }
  for (int c = 0; c < C; ++c) {
    if (c0 + c >= valid) break;
    for (int r = 0; r < R; ++r) {
      float s = Reduce(acc[r][c]);
      if (bias != nullptr) s += bias[c0 + c];
      y[r][c0 + c] = s;
    }
  }
}

template <class D, int R, int C>
METRALE_AVX512 void GemvPasses(const QuantLayout& l, const uint8_t* tile, const float* const* x,
                               const float* bias, float* const* y, int64_t valid) {
  for (int c0 = 0; c0 < kQuantRows && c0 < valid; c0 += C)
    GemvTile<D, R, C>(l, tile, x, c0, bias, y, valid);
}

template <class D>
METRALE_AVX512 void Gemv(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  const QuantLayout& l = *t.w;
  const auto rows = static_cast<int>(t.x.n_rows);
  for (int64_t g = o_begin / kQuantRows; g * kQuantRows < o_end; ++g) {
    const uint8_t* tile = l.tile(g);
    const int64_t valid = std::min(kQuantRows, o_end - g * kQuantRows);
    const float* x[4];
    float* y[4];
    for (int r = 0; r < rows; ++r) {
      x[r] = t.x.row(r);
      y[r] = t.y.row(r) + g * kQuantRows;
    }
    const float* bias = t.bias != nullptr ? t.bias + g * kQuantRows : nullptr;
    switch (rows) {
      case 1:
        GemvPasses<D, 1, 16>(l, tile, x, bias, y, valid);
        break;
      case 2:
        GemvPasses<D, 2, 8>(l, tile, x, bias, y, valid);
        break;
      case 3:
        GemvPasses<D, 3, 4>(l, tile, x, bias, y, valid);
        break;
      default:
        GemvPasses<D, 4, 4>(l, tile, x, bias, y, valid);
        break;
    }
  }
}

constexpr int64_t kGemmRows = 64;                   // x rows per pass over a tile
constexpr int64_t kSliceBlocks = 8;                 // blocks per K slice
constexpr int64_t kSlice = kSliceBlocks * kQuantK;  // positions per K slice
constexpr int64_t kAccFloats = kQuantRows * 16;     // one x row's accumulators (16 x 16)

// R x rows (at the slice's start) x 4 decoded weight rows (w: the first, rows kSlice apart)
// over n positions; acc: the accumulators of row 0 / column 0, row r column c at
// (r * 16 + c) * 16. `first`: start from zero instead of loading.
template <int R>
METRALE_AVX512 void FmaTile(const float* const* x, const float* w, int64_t n, float* acc,
                            bool first) {
  constexpr int C = 4;
  __m512 a[R][C];
  METRALE_UNROLL for (int r = 0; r < R; ++r) METRALE_UNROLL for (int c = 0; c < C; ++c) a[r][c] =
      first ? _mm512_setzero_ps() : _mm512_load_ps(acc + (r * 16 + c) * 16);
  for (int64_t k = 0; k < n; k += 16) {
    __m512 wv[C];
    METRALE_UNROLL for (int c = 0; c < C; ++c) wv[c] = _mm512_load_ps(w + c * kSlice + k);
    METRALE_UNROLL for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x[r] + k);
      METRALE_UNROLL for (int c = 0; c < C; ++c) a[r][c] = _mm512_fmadd_ps(xv, wv[c], a[r][c]);
    }
  }
  METRALE_UNROLL for (int r = 0; r < R; ++r) METRALE_UNROLL for (int c = 0; c < C; ++c)
      _mm512_store_ps(acc + (r * 16 + c) * 16, a[r][c]);
}

// Per-thread GEMM scratch (decoded slice, then the accumulators of kGemmRows rows), 64-byte
// aligned; allocated once per thread.
float* GemmScratch() {
  constexpr size_t kFloats = kQuantRows * kSlice + kGemmRows * kAccFloats;
  thread_local std::unique_ptr<float[]> buffer;
  if (!buffer) buffer = std::make_unique<float[]>(kFloats + 16);
  const auto at = reinterpret_cast<uintptr_t>(buffer.get());
  return buffer.get() + ((64 - at % 64) % 64) / sizeof(float);
}

// Row c + J of a block decoded into the GEMM scratch (row at (c + J) * kSlice).
template <class D, int J>
METRALE_AVX512_INLINE void DecodeRow(const D& dec, typename D::Line line, int c, float* out) {
  __m512 lo, hi;
  dec.template row<J, kQuantRows>(line, c, lo, hi);
  _mm512_store_ps(out + (c + J) * kSlice, lo);
  _mm512_store_ps(out + (c + J) * kSlice + 16, hi);
}

// Tile rows' blocks [b0, b1) decoded into w (row c at c * kSlice). `seg` is the cursor of the
// segment holding b0 (advanced here).
template <class D>
METRALE_AVX512 void DecodeSlice(const QuantLayout& l, const uint8_t* tile, int64_t& seg, int64_t b0,
                                int64_t b1, D& dec, float* w) {
  const QuantSegment* segs = l.segment_table();
  for (int64_t b = b0; b < b1; ++b) {
    bool fresh = b == b0;
    while (b >= segs[seg].block_begin + segs[seg].n_blocks) {
      ++seg;
      fresh = true;
    }
    const QuantSegment& s = segs[seg];
    if (fresh) dec.begin(l, tile, s, 0, static_cast<int>(kQuantRows));
    const uint8_t* block = tile + s.codes + (b - s.block_begin) * kQuantRows * D::kRowBytes;
    float* out = w + (b - b0) * kQuantK;
    METRALE_UNROLL for (int c = 0; c < kQuantRows; c += 4) {
      const typename D::Line line = dec.line(block, c);
      DecodeRow<D, 0>(dec, line, c, out);
      DecodeRow<D, 1>(dec, line, c, out);
      DecodeRow<D, 2>(dec, line, c, out);
      DecodeRow<D, 3>(dec, line, c, out);
    }
  }
}

template <class D>
METRALE_AVX512 void Gemm(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  const QuantLayout& l = *t.w;
  const int64_t n_blocks = l.kp / kQuantK;
  float* w = GemmScratch();
  float* acc = w + kQuantRows * kSlice;
  D dec;
  for (int64_t g = o_begin / kQuantRows; g * kQuantRows < o_end; ++g) {
    const uint8_t* tile = l.tile(g);
    const int64_t valid = std::min(kQuantRows, o_end - g * kQuantRows);
    const int64_t cols = (valid + 3) / 4 * 4;
    for (int64_t r0 = 0; r0 < t.x.n_rows; r0 += kGemmRows) {
      const int64_t mr = std::min(kGemmRows, t.x.n_rows - r0);
      int64_t seg = 0;
      for (int64_t b0 = 0; b0 < n_blocks; b0 += kSliceBlocks) {
        const int64_t b1 = std::min(n_blocks, b0 + kSliceBlocks);
        DecodeSlice(l, tile, seg, b0, b1, dec, w);
        const int64_t n = (b1 - b0) * kQuantK;
        for (int64_t rr = 0; rr < mr; rr += 4) {
          const float* x[4];
          const int rows = static_cast<int>(std::min<int64_t>(4, mr - rr));
          for (int r = 0; r < rows; ++r) x[r] = t.x.row(r0 + rr + r) + b0 * kQuantK;
          for (int64_t c = 0; c < cols; c += 4) {
            float* a = acc + (rr * 16 + c) * 16;
            switch (rows) {
              case 1:
                FmaTile<1>(x, w + c * kSlice, n, a, b0 == 0);
                break;
              case 2:
                FmaTile<2>(x, w + c * kSlice, n, a, b0 == 0);
                break;
              case 3:
                FmaTile<3>(x, w + c * kSlice, n, a, b0 == 0);
                break;
              default:
                FmaTile<4>(x, w + c * kSlice, n, a, b0 == 0);
                break;
            }
          }
        }
      }
      for (int64_t r = 0; r < mr; ++r) {
        float* y = t.y.row(r0 + r) + g * kQuantRows;
        for (int64_t c = 0; c < valid; ++c) {
          float s = Reduce(_mm512_load_ps(acc + (r * 16 + c) * 16));
          if (t.bias != nullptr) s += t.bias[g * kQuantRows + c];
          y[c] = s;
        }
      }
    }
  }
}

template <class D>
METRALE_AVX512 void Run(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  if constexpr (requires { D::warm(*t.w); }) D::warm(*t.w);
  if (t.x.n_rows <= 4) {
    Gemv<D>(t, o_begin, o_end);
  } else {
    Gemm<D>(t, o_begin, o_end);
  }
}

template <class Base, bool kAsym>
METRALE_AVX512 void RunNibbles(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  if (t.w->per_half) {
    Run<NibbleDecoder<Base, kAsym, false>>(t, o_begin, o_end);
  } else {
    Run<NibbleDecoder<Base, kAsym, true>>(t, o_begin, o_end);
  }
}

METRALE_AVX512 void LinearQuant(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  const QuantLayout& l = *t.w;
  switch (l.format) {
    case WeightFormat::kInt4:
      if (l.asymmetric) return RunNibbles<Int4Values, true>(t, o_begin, o_end);
      return RunNibbles<Int4Values, false>(t, o_begin, o_end);
    case WeightFormat::kNvfp4:
      if (l.e4m3_slots) return Run<E4m3NibbleDecoder>(t, o_begin, o_end);
      return RunNibbles<E2m1Values, false>(t, o_begin, o_end);
    case WeightFormat::kInt8:
      if (l.asymmetric) return Run<Int8Decoder<true>>(t, o_begin, o_end);
      return Run<Int8Decoder<false>>(t, o_begin, o_end);
    case WeightFormat::kFp8:
      return Run<Fp8Decoder>(t, o_begin, o_end);
    default:
      std::abort();  // prepare() packs quantized formats only
  }
}

}  // namespace

bool quant_simd_enabled() {
  static const bool enabled = cpu_pack_allowed() && cpu_has_avx512();
  return enabled;
}

void linear_quant_avx512(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  LinearQuant(t, o_begin, o_end);
}

#else  // not x86-64: the portable kernel only

bool quant_simd_enabled() { return false; }
void linear_quant_avx512(const QuantTask&, int64_t, int64_t) { std::abort(); }

#endif

void linear_quant(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  if (t.w->q8) {
    if (q8_simd_enabled()) return linear_q8_avx512(t, o_begin, o_end);
    return linear_q8_portable(t, o_begin, o_end);
  }
  if (quant_simd_enabled()) {
    linear_quant_avx512(t, o_begin, o_end);
  } else {
    linear_quant_portable(t, o_begin, o_end);
  }
}

}  // namespace metrale::cpu
