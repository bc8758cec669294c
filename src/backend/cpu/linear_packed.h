#pragma once
// Packed bf16 weights for the AVX-512 linear kernel (x86 only; elsewhere, or on a CPU without
// AVX-512 F+BW, prepare() keeps plain rows and the Highway kernel runs).
//
// Layout (packing tag kPackingBf16x16): output rows in groups of 16 (the last group padded
// with zero rows), each group's K range in blocks of 32 values; a block of one row is one
// 64-byte line, and the 16 rows' lines of a block follow each other, so a group is read as
// one sequential stream: line(g, b, r) at (((g * KB + b) * 16 + r) * 32) values. Inside a
// line, 32-bit lane j holds w[32b + j] in its low half and w[32b + 16 + j] in its high
// half: a shift (low) and a mask (high) give two f32 vectors that line up with two plain
// loads of x, so activations stay f32 (HF's reference numerics) and need no shuffle.
//
// Summation order of one output, identical for every row count, tiling and thread split:
// one 16-lane accumulator, per block acc += x_lo * w_lo, then acc += x_hi * w_hi (FMA),
// blocks in order, then _mm512_reduce_add_ps, then + bias.
#include <cstddef>
#include <cstdint>

#include "backend/cpu/kernels.h"

namespace metrale::cpu {

inline constexpr uint32_t kPackingBf16x16 = 1;
inline constexpr int64_t kPackRows = 16;
inline constexpr int64_t kPackK = 32;

// True when this CPU runs the packed kernel (checked once) and METRALE_CPU_PACK is not "0"
// (the switch exists for A/B measurements against the plain-row kernel).
bool packed_bf16_enabled();
// Whether an [n_out, n_in] bf16 matrix can be packed (n_in a multiple of kPackK).
inline bool packable_bf16(int64_t n_in) { return n_in > 0 && n_in % kPackK == 0; }
size_t packed_bf16_bytes(int64_t n_out, int64_t n_in);
// Plain bf16 rows -> packed (dst holds packed_bf16_bytes; padding rows are zeroed).
void pack_bf16(const uint16_t* src, int64_t n_out, int64_t n_in, uint16_t* dst);
// Row `row` of a packed matrix widened to f32 (embedding lookups from a tied table).
void unpack_bf16_row(const uint16_t* packed, int64_t n_in, int64_t row, float* out);

// Same contract as linear_bf16 but on packed weights; o_begin must be a multiple of 16.
// Only call when packed_bf16_enabled().
void linear_bf16_packed(const LinearTask& t, int64_t o_begin, int64_t o_end);

}  // namespace metrale::cpu
