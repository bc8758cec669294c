#pragma once
// bf16-compute linear kernel (Compute::kBF16): activations rounded to bf16, products summed in
// f32 by vdpbf16ps (AVX-512 BF16), as llama.cpp's BF16 type does. On an AVX-512 CPU without
// AVX512_BF16 an AVX-512F twin computes the same sums, on an AVX2 CPU an AVX2/FMA twin does,
// and elsewhere a scalar loop does (slow, but the mode means the same numbers on every CPU).
//
// Layout (packing tag kPackingBf16Pairs): output rows in groups of 16; a group is n_in / 2
// lines of 64 bytes, one per k pair p, lane o of line p holding w[16g + o][2p] (low half) and
// w[16g + o][2p + 1] (high half). A broadcast of x's pair p (two adjacent bf16 of the rounded
// row) against a line adds 16 outputs' products at once, so no horizontal sum is ever needed.
// Groups come in tiles of kPairsTileGroups (3; the last tile padded with zero rows) whose
// lines interleave by p: line(g, p) starts at value
// (((g / 3) * (n_in / 2) + p) * 3 + g % 3) * 16 * 2, so the kernel, which reads the 3 groups
// of a tile side by side (3 independent accumulators), reads one sequential stream instead of
// 3 streams n_in * 32 bytes apart: on a Zen 4 VM, 3 such streams (with or without software
// prefetch) read ~20% slower than one, and the batch-1 decode that read them fell below
// llama.cpp's.
//
// Summation order of one output, identical for every row count, tiling and thread split:
// acc = 0; for p in order: acc += x[2p+1] * w[2p+1]; acc += x[2p] * w[2p] (each product of
// two bf16 is exact in f32; each add rounds to nearest even), then + bias. That is vdpbf16ps's
// documented order; the AVX-512F and AVX2 twins issue the same two FMAs, the scalar loop the same
// adds. vdpbf16ps also treats subnormal inputs as zero and flushes subnormal results, which the
// twin does not: the two agree bit for bit unless a subnormal shows up (activations and weights of
// real checkpoints sit far above 1e-38; the tests check bit equality on normal data).
#include <cstddef>
#include <cstdint>

#include "backend/cpu/kernels.h"

namespace metrale::cpu {

inline constexpr uint32_t kPackingBf16Pairs = 2;

// True when this CPU runs the SIMD kernels (AVX-512 F+BW+VL; checked once).
bool pairs_bf16_simd();
// True when this CPU has AVX2 and FMA (the AVX2 twin; checked once).
bool pairs_bf16_avx2();
// True when it runs on vdpbf16ps (AVX512_BF16) rather than the AVX-512F twin.
bool pairs_bf16_native();
inline bool pairs_packable(int64_t n_in) { return n_in > 0 && n_in % 2 == 0; }
size_t pairs_bf16_bytes(int64_t n_out, int64_t n_in);
// Plain bf16 rows -> pair layout (dst holds pairs_bf16_bytes; padding rows are zeroed).
void pack_pairs_bf16(const uint16_t* src, int64_t n_out, int64_t n_in, uint16_t* dst);
// Row `row` of a pair-packed matrix widened to f32 (embedding lookups from a tied table).
void unpack_pairs_row(const uint16_t* packed, int64_t n_in, int64_t row, float* out);

// Rows [r_begin, r_end) of x rounded to bf16 (core/dtype f32_to_bf16: RNE, NaN -> 0x7FC0)
// into out, n_cols values per row, rows back to back.
void round_rows_bf16(ConstRows x, int64_t r_begin, int64_t r_end, uint16_t* out);

struct PairsTask {
  const uint16_t* x = nullptr;  // [rows, n_in] bf16 (round_rows_bf16), rows back to back
  int64_t n_rows = 0;
  const uint16_t* w = nullptr;  // pair-packed [n_out, n_in]
  int64_t n_in = 0;
  int64_t n_out = 0;
  const float* bias = nullptr;  // [n_out] or null
  Rows y;                       // [rows, n_out]
};
// Which implementation runs: kAuto picks the best this CPU has; tests force the others
// (kAvx512F needs pairs_bf16_simd(), kAvx2 pairs_bf16_avx2()).
enum class PairsPath : uint8_t { kAuto, kAvx512F, kAvx2, kScalar };
// Groups of 16 outputs that one weight tile reads side by side (and the layout interleaves);
// callers splitting the outputs over threads keep pieces a multiple of this many groups so
// tiles stay whole and each piece is one sequential read (any split still computes right).
inline constexpr int kPairsTileGroups = 3;
// y rows for outputs [o_begin, o_end); o_begin a multiple of 16.
void linear_bf16_pairs(const PairsTask& t, int64_t o_begin, int64_t o_end,
                       PairsPath path = PairsPath::kAuto);

}  // namespace metrale::cpu
