#pragma once
// Quantized linear kernels (kInt4, kInt8, kFp8, kNvfp4). prepare() always repacks a quantized
// weight (both PrepareModes) into one buffer of its own, laid out for these kernels; the kernels
// decode it on the fly. Two families of layout, chosen at prepare by the backend's Compute:
//   f32 layouts (Compute::kF32 / kBF16, and fp8 always): f32 activations meet the dequantized
//     weights, which equal dequantize_row bit for bit (this page, below).
//   q8 layouts (Compute::kInt8, int4 / int8 / nvfp4): activations quantized to int8 per 32
//     packed positions meet integer codes in vpdpbusd (linear_quant_q8.cc; "Q8 layouts" below).
// The AVX-512 kernels run when the CPU has AVX-512 F+BW (+VNNI for q8; checked once) and
// METRALE_CPU_PACK is not "0"; otherwise portable kernels compute the same bits, slowly.
//
// Packed order of the inputs. A row's inputs are reordered into "packed positions" so that
// every 16 consecutive positions share one scale group: each group's columns (ascending; with
// g_idx, the columns whose g_idx is the group, so GPTQ's act-order weights become plain groups)
// fill a run of positions padded with zero weights to a multiple of 32, the groups one after
// another. When every group has at most 16 columns (group 16: NVFP4, or tiny groups) each
// group fills 16 positions instead and a block of 32 holds two groups ("per-half" layout). The
// kernels read x in packed order: when that order is not the identity (g_idx, or padding), the
// caller gathers x once per call (prepare_quant_input; a zero for each padding position), and
// the gathered row has kp columns. Weights without g_idx whose groups are multiples of 32 (or
// exactly 16) and n_in % 32 == 0 need no gather in an f32 layout.
//
// Packed buffer (packing tag kPackingQuant): a QuantLayout header, the permutation (int32 per
// packed position: its input column, or -1 for padding), the segment table, NVFP4's scale
// tables, then the tiles. A tile is 16 output rows (the last padded with zero rows); a segment
// is a run of 32-position blocks sharing scales (one group, or in the per-half layout one block
// of two groups). A tile is one sequential stream of its segments, each its slot(s) then its
// blocks:
//   slot   the (row, group) scales of the tile's 16 rows: 16 f32 s = scale * scale_global (+
//          16 f32 zero points z for asymmetric int weights), or for NVFP4 with e4m3 scales the
//          16 raw e4m3 bytes (decode then reads ~4.5 bits per weight). The per-half layout
//          stores two slots (lo, hi halves).
//   block  16 rows' codes. int4 / nvfp4: 4 lines of 64 bytes, line L holding rows 4L..4L+3,
//          row c's byte d at (c / 4) * 64 + 4 d + c % 4; that byte holds position d in its low
//          nibble and d + 16 in its high nibble. One 64-byte load thus gives four rows' codes,
//          each dword of it position d of the four rows, and a shift (by 8 J or 8 J + 4) puts
//          row J's nibble in the low bits that vpermps reads as its index: no widening shuffle.
//          int8 / fp8: row c's 32 bytes at c * 32, byte j = position j.
// A block decodes to two f32 vectors per row (lo: positions 0-15, hi: 16-31) that line up with
// two plain loads of x, and to dequantize_row's f32 weights bit for bit: int4 looks the nibble
// up in the table (float(i - 8) - z) * s, nvfp4 (f32 scales) in e2m1(i) * s, built per segment
// and row (in the per-half layout the unscaled value is looked up and multiplied by s per half:
// the same product); nvfp4 with e4m3 scales looks up the row of a per-weight table [256][16] of
// e2m1(i) * (e4m3(code) * scale_global) picked by the scale byte (16 KB, built at prepare with
// the reference's arithmetic); int8 computes (float(q) - z) * s; fp8 widens e4m3 to f16 by a
// bit shift (the f16 value is e4m3 / 256, exact) and multiplies by s * 256, folded into its slot
// at prepare (exact too, so the product is the reference's). prepare rejects fp8 NaN codes,
// which the shift cannot represent, and fp8 scales whose * 256 overflows f32.
//
// Cost (Zen 4, one row, per 32 weights): int4 / nvfp4 2 permutes + 2 FMAs + 1.75 shifts; int8
// and fp8 also widen, convert and multiply every 16. That is more arithmetic than the bf16
// kernel's 2 FMAs + 2 bit ops, so with the weight in cache a 4-bit GEMV takes ~1.3x bf16's
// time; from DRAM, as in a decode step, it reads 3.6x fewer bytes and takes 2.1-2.9x less time
// than bf16 (int8 / fp8: 1.2-1.6x less). bench/kernels_bench.cc BM_QuantLinear, `cold`.
//
// Summation order of one output, identical for every row count (GEMV for up to 4 rows, decoding
// into registers; GEMM for more, decoding a tile's K slice into an f32 scratch first), tiling,
// thread split and for the portable kernel: one 16-lane accumulator, acc = 0; for each block of
// 32 packed positions in order: acc = fma(x_lo, w_lo, acc), then acc = fma(x_hi, w_hi, acc);
// then the lanes are added as a fixed tree: h[i] = a[i] + a[i + 8] (i < 8), then h[i] + h[i + 4]
// (i < 4), then h[i] + h[i + 2] (i < 2), then h[0] + h[1]; then + bias.
//
// Q8 layouts (QuantLayout::q8; Compute::kInt8). The same packed order, segments, tiles and
// slots, with codes arranged for vpdpbusd (16 lanes, each the sum of 4 byte products) and the
// input quantized once per call (prepare_quant_input) into int8 per block of 32 packed positions,
// as llama.cpp quantizes activations for its Q4_0 / Q8_0 weights:
//   input row  int8 q[kp], then a Q8Block {d, s, s_lo, s_hi} per block: amax = max |x| over the
//              block, q = nearest-even(x * (127 / amax)), d = amax / 127 (all 0 when amax is 0;
//              d = NaN and q = 0 when the block holds a NaN or an infinity, so it propagates);
//              s / s_lo / s_hi = the sum of q over the block / its positions 0-15 / 16-31.
//   codes      unsigned u = code + offset, so value = (u - off) * s: int4 u = the nibble, off =
//              8 (+ z); int8 u = q + 128, off = 128 (+ z); nvfp4 u = 2 e2m1 + 12 (0..24, looked
//              up from the nibble by vpshufb), off = 12, and s is half the scale. A block is
//              lines of 64 bytes, dword lane c = tile row c: int4 / nvfp4 4 lines, line L's byte
//              4c + j holding position 8L + j (low nibble) and 8L + 4 + j (high nibble); int8 8
//              lines, line L's byte 4c + j = position 4L + j.
//   slots      16 f32 s (scale * scale_global; nvfp4 halved), then for asymmetric weights 16
//              f32 off; nvfp4 with e4m3 scales keeps the 16 raw bytes and the kernel takes
//              s = (e4m3 / 256) * q8_scale (q8_scale = scale_global * 128).
// Arithmetic of one output, identical for every row count, tiling, thread split and for the
// portable kernel: acc = 0; per segment (in the per-half layout, per half): G = 0; per block:
// I = sum of u * q over the block (or half; int32, exact), T = float(I) - off * S with S the
// input block's (or half's) sum of q (exact: every term is an integer below 2^24),
// G = fma(T, d, G); then acc = fma(G, s, acc) with the slot's s. y = acc (+ bias).
// The result differs from the f32 layouts' by the activations' rounding: |y - y_f32| <= the sum
// over positions of |w| * d / 2, plus f32 rounding.
// Cost (Zen 4, per 16 rows x 32 positions): int4 4 loads + 12 bit ops + 8 vpdpbusd + 3 f32
// ops per input row, about a tenth of the f32 layout's work: one thread's int4 GEMV at
// [1024, 3072] takes 32 us hot (3.6x the f32 layout), a 64-row GEMM 3.7x
// (bench/kernels_bench.cc BM_QuantLinear, int8:1).
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace metrale::cpu {

inline constexpr uint32_t kPackingQuant = 3;
inline constexpr int64_t kQuantRows = 16;  // output rows per tile
inline constexpr int64_t kQuantK = 32;     // packed positions per block

// A run of blocks sharing their scales. Offsets are bytes from the start of a tile (every tile
// has the same structure).
struct QuantSegment {
  int32_t block_begin = 0;  // first block (packed positions 32 * block_begin ...)
  int32_t n_blocks = 0;
  uint32_t slot_lo = 0;  // slot of positions 0-15 of each block
  uint32_t slot_hi = 0;  // slot of positions 16-31 (== slot_lo unless per-half)
  uint32_t codes = 0;    // the first block's codes
};

// Header at the start of a packed buffer (64-byte aligned).
struct QuantLayout {
  WeightFormat format = WeightFormat::kInt4;
  bool asymmetric = false;  // f32 slots carry 16 zero points after the 16 scales
  bool e4m3_slots = false;  // slots are 16 raw e4m3 bytes (nvfp4), decoded by `tables`
  bool per_half = false;    // every segment is one block whose halves have their own slot
  bool q8 = false;          // a q8 layout (codes for vpdpbusd, int8 input)
  float q8_scale = 0.0f;    // q8 with e4m3 slots: s = (e4m3 / 256) * q8_scale
  int64_t n_out = 0, n_in = 0;
  int64_t kp = 0;  // packed positions per row, a multiple of kQuantK
  int64_t n_segments = 0;
  int64_t tile_bytes = 0;
  uint64_t perm = 0;      // offset of int32[kp] (input column or -1), 0 when x is read as is
  uint64_t segments = 0;  // offset of QuantSegment[n_segments]
  uint64_t tiles = 0;     // offset of tile 0 (64-byte aligned)
  // e4m3 slots: offset of f32[256][16], row `code` = e2m1(i) * (e4m3(code) * scale_global)
  uint64_t tables = 0;

  int64_t row_bytes() const {
    return format == WeightFormat::kInt8 || format == WeightFormat::kFp8 ? 32 : 16;
  }
  int64_t slot_bytes() const { return e4m3_slots ? 16 : asymmetric ? 128 : 64; }
  const int32_t* permutation() const {
    return perm == 0 ? nullptr : reinterpret_cast<const int32_t*>(base() + perm);
  }
  const QuantSegment* segment_table() const {
    return reinterpret_cast<const QuantSegment*>(base() + segments);
  }
  const uint8_t* tile(int64_t t) const {
    return base() + tiles + static_cast<size_t>(t) * static_cast<size_t>(tile_bytes);
  }
  const float* scale_tables() const { return reinterpret_cast<const float*>(base() + tables); }

 private:
  const uint8_t* base() const { return reinterpret_cast<const uint8_t*>(this); }
};

// q8 nvfp4: u = 2 e2m1(nibble) + 12 (linear_quant.h, Q8 layouts).
inline constexpr uint8_t kQ8Nvfp4Codes[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                              12, 11, 10, 9,  8,  6,  4,  0};
// Formats that have a q8 layout.
inline bool q8_packable(WeightFormat f) {
  return f == WeightFormat::kInt4 || f == WeightFormat::kInt8 || f == WeightFormat::kNvfp4;
}
// Bytes of the packed buffer of w (a quantized weight with valid QuantParams); q8: the q8
// layout (only for q8_packable formats).
size_t quant_packed_bytes(const WeightTensor& w, bool q8 = false);
// Writes w's packed buffer into dst (quant_packed_bytes, 64-byte aligned). Reads w.data and
// w.quant only here: the result refers to neither. Throws for fp8 NaN codes and for scales
// whose * 256 overflows f32.
void pack_quant(const WeightTensor& w, void* dst, bool q8 = false);

inline const QuantLayout& quant_layout(const WeightTensor& w) {
  return *static_cast<const QuantLayout*>(w.data);
}
// One block of a q8 input row (the layout above).
struct Q8Block {
  float d, s, s_lo, s_hi;
};
// Bytes of one q8 input row of kp packed positions (codes, then the blocks; 64-byte multiple).
inline int64_t q8_row_bytes(int64_t kp) {
  return (kp + kp / kQuantK * static_cast<int64_t>(sizeof(Q8Block)) + 63) / 64 * 64;
}
// Bytes per row of the input w's kernel reads instead of x (prepare_quant_input, once per
// call): a q8 row, or the row gathered into packed order (kp floats); 0 when it reads x as is.
inline int64_t quant_input_bytes(const WeightTensor& w) {
  if (w.packing != kPackingQuant) return 0;
  const QuantLayout& l = quant_layout(w);
  if (l.q8) return q8_row_bytes(l.kp);
  return l.perm != 0 ? l.kp * static_cast<int64_t>(sizeof(float)) : 0;
}
// Rows [r_begin, r_end) of x as the kernel reads them, row r at out + r * quant_input_bytes:
// q8 layouts quantize (in packed order), f32 layouts gather into packed order (padding
// positions get 0). Only for weights whose quant_input_bytes is not 0.
void prepare_quant_input(const QuantLayout& l, ConstRows x, int64_t r_begin, int64_t r_end,
                         void* out);
// prepare_quant_input's q8 quantization: AVX-512 (only when q8_simd_enabled()) and its
// portable twin (the same bytes).
void quantize_q8_rows_avx512(const QuantLayout& l, ConstRows x, int64_t r_begin, int64_t r_end,
                             void* out);
void quantize_q8_rows_portable(const QuantLayout& l, ConstRows x, int64_t r_begin, int64_t r_end,
                               void* out);
// Row `row` of the packed weight dequantized in the original column order (n_in values):
// equal to dequantize_row of the source (tests; nothing on a hot path calls it).
void unpack_quant_row(const QuantLayout& l, int64_t row, float* out);

// y[r, o] = sum over packed positions of x[r, p] * w[o, p] (+ bias[o]), in the order above.
struct QuantTask {
  ConstRows x;  // f32 layouts: [rows, kp] packed-order input (x itself when no gather is needed)
  const uint8_t* x8 = nullptr;  // q8 layouts: x.n_rows q8 input rows, q8_row_bytes(kp) apart
  const QuantLayout* w = nullptr;
  const float* bias = nullptr;  // [n_out] or null
  Rows y;                       // [rows, n_out]
};

// True when this CPU runs the AVX-512 kernel (checked once) and METRALE_CPU_PACK is not "0".
bool quant_simd_enabled();
// The same for the q8 kernels (AVX-512 F+BW+VNNI).
bool q8_simd_enabled();
// Outputs [o_begin, o_end), o_begin a multiple of kQuantRows: the AVX-512 kernel when
// quant_simd_enabled(), else the portable one.
void linear_quant(const QuantTask& t, int64_t o_begin, int64_t o_end);
// The portable kernel (any CPU): the same bits as the AVX-512 kernel.
void linear_quant_portable(const QuantTask& t, int64_t o_begin, int64_t o_end);
// The AVX-512 kernel; only call when quant_simd_enabled() (or the CPU has AVX-512 F+BW).
void linear_quant_avx512(const QuantTask& t, int64_t o_begin, int64_t o_end);
// q8 layouts (linear_quant_q8.cc): the VNNI kernel and its portable twin.
void linear_q8_avx512(const QuantTask& t, int64_t o_begin, int64_t o_end);
void linear_q8_portable(const QuantTask& t, int64_t o_begin, int64_t o_end);

}  // namespace metrale::cpu
