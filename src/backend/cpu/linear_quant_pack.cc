// Quantized weights: packing (prepare time), the input gather, and the portable kernel. The
// layout and the summation order are in linear_quant.h; the AVX-512 kernel is linear_quant.cc.
// The scalar decode here is the twin of the SIMD decoders, formula for formula (the fp8 f16
// trick and NVFP4's scale tables included), so the portable kernel gives the AVX-512 kernel's
// bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "backend/cpu/linear_quant.h"
#include "core/dtype.h"
#include "core/error.h"

namespace metrale::cpu {
namespace {

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

constexpr size_t kScaleTableFloats = 256 * 16;  // QuantLayout::tables

// The packed order of one weight: which input column each packed position reads, and the
// segments (runs of blocks sharing their scale groups).
struct Plan {
  struct Seg {
    int32_t block_begin, n_blocks;
    int64_t g_lo, g_hi;  // scale groups of positions 0-15 / 16-31 of each block
  };
  std::vector<int32_t> perm;  // [kp]
  std::vector<Seg> segs;
  bool per_half = false, identity = false, asymmetric = false, e4m3_slots = false, q8 = false;
  int64_t kp = 0;
  int64_t tile_bytes = 0;
  size_t perm_offset = 0, segments_offset = 0, tables_offset = 0, tiles_offset = 0, total = 0;
};

int64_t row_bytes_of(WeightFormat f) {
  return f == WeightFormat::kInt8 || f == WeightFormat::kFp8 ? 32 : 16;
}

// What the fp8 decode cannot represent: NaN codes (the f16 trick has no NaN) and scales whose
// * 256 overflows f32. Checked before anything is allocated.
void check_fp8(const WeightTensor& w) {
  const QuantParams& q = w.quant;
  for (int64_t i = 0; i < w.n_out * q.n_groups; ++i) {
    const float s = quant_scale(q, i / q.n_groups, i % q.n_groups);
    METRALE_CHECK(std::isfinite(s * 256.0f), "weight '", w.name, "' (fp8): scale of row ",
                  i / q.n_groups, " group ", i % q.n_groups, " (", s,
                  ") is too large for the CPU kernel");
  }
  const auto* codes = static_cast<const uint8_t*>(w.data);
  for (int64_t i = 0; i < w.n_out * w.n_in; ++i) {
    METRALE_CHECK((codes[i] & 0x7Fu) != 0x7Fu, "weight '", w.name, "' (fp8): NaN at row ",
                  i / w.n_in, " column ", i % w.n_in);
  }
}

Plan make_plan(const WeightTensor& w, bool q8) {
  const QuantParams& q = w.quant;
  METRALE_CHECK(!q8 || q8_packable(w.format), "weight '", w.name,
                "': ", weight_format_name(w.format), " has no q8 layout");
  if (w.format == WeightFormat::kFp8) check_fp8(w);
  Plan p;
  p.q8 = q8;
  p.asymmetric = q.zeros != nullptr;
  p.e4m3_slots = w.format == WeightFormat::kNvfp4 && q.scale_dtype == DType::kF8E4M3;
  // Columns grouped by scale group, ascending within a group (a stable counting sort).
  const int64_t n_groups = q.n_groups;
  std::vector<int64_t> count(static_cast<size_t>(n_groups), 0);
  auto group_of = [&](int64_t k) -> int64_t {
    return q.g_idx != nullptr ? q.g_idx[k] : k / q.group;
  };
  for (int64_t k = 0; k < w.n_in; ++k) ++count[static_cast<size_t>(group_of(k))];
  std::vector<int64_t> start(static_cast<size_t>(n_groups) + 1, 0);
  for (int64_t g = 0; g < n_groups; ++g)
    start[static_cast<size_t>(g) + 1] =
        start[static_cast<size_t>(g)] + count[static_cast<size_t>(g)];
  std::vector<int32_t> cols(static_cast<size_t>(w.n_in));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t k = 0; k < w.n_in; ++k)
      cols[static_cast<size_t>(fill[static_cast<size_t>(group_of(k))]++)] = static_cast<int32_t>(k);
  }
  const int64_t max_count = *std::max_element(count.begin(), count.end());
  p.per_half = max_count <= 16;
  auto place = [&](int64_t g, int64_t positions) {
    for (int64_t i = 0; i < positions; ++i) {
      p.perm.push_back(i < count[static_cast<size_t>(g)]
                           ? cols[static_cast<size_t>(start[static_cast<size_t>(g)] + i)]
                           : -1);
    }
  };
  if (!p.per_half) {
    for (int64_t g = 0; g < n_groups; ++g) {
      if (count[static_cast<size_t>(g)] == 0) continue;
      const int64_t blocks = (count[static_cast<size_t>(g)] + kQuantK - 1) / kQuantK;
      p.segs.push_back(
          {static_cast<int32_t>(p.perm.size() / kQuantK), static_cast<int32_t>(blocks), g, g});
      place(g, blocks * kQuantK);
    }
  } else {
    std::vector<int64_t> halves;  // the groups with columns, one half (16 positions) each
    for (int64_t g = 0; g < n_groups; ++g)
      if (count[static_cast<size_t>(g)] > 0) halves.push_back(g);
    for (size_t h = 0; h < halves.size(); h += 2) {
      const int64_t lo = halves[h], hi = h + 1 < halves.size() ? halves[h + 1] : lo;
      p.segs.push_back({static_cast<int32_t>(p.perm.size() / kQuantK), 1, lo, hi});
      place(lo, 16);
      if (h + 1 < halves.size()) {
        place(hi, 16);
      } else {
        p.perm.insert(p.perm.end(), 16, -1);  // filler half: zero weights, the lo slot again
      }
    }
  }
  p.kp = static_cast<int64_t>(p.perm.size());
  p.identity = p.kp == w.n_in;
  for (int64_t k = 0; p.identity && k < p.kp; ++k) p.identity = p.perm[static_cast<size_t>(k)] == k;

  const int64_t slot_bytes = p.e4m3_slots ? 16 : p.asymmetric ? 128 : 64;
  const int64_t slots_per_seg = p.per_half ? 2 : 1;
  const int64_t rb = row_bytes_of(w.format);
  for (const Plan::Seg& s : p.segs)
    p.tile_bytes += slots_per_seg * slot_bytes + s.n_blocks * kQuantRows * rb;
  p.tile_bytes = static_cast<int64_t>(round_up(static_cast<size_t>(p.tile_bytes), 64));
  size_t at = round_up(sizeof(QuantLayout), 64);
  if (!p.identity) {
    p.perm_offset = at;
    at = round_up(at + static_cast<size_t>(p.kp) * sizeof(int32_t), 64);
  }
  p.segments_offset = at;
  at = round_up(at + p.segs.size() * sizeof(QuantSegment), 64);
  if (p.e4m3_slots && !p.q8) {
    p.tables_offset = at;
    at += kScaleTableFloats * sizeof(float);
  }
  p.tiles_offset = at;
  const int64_t n_tiles = (w.n_out + kQuantRows - 1) / kQuantRows;
  p.total = at + static_cast<size_t>(n_tiles * p.tile_bytes);
  return p;
}

// The f16 bits of an e4m3 code: the same sign, exponent and mantissa fields one place lower
// in a wider exponent, so the f16 value is the e4m3 value / 256 (exact, subnormals included;
// the NaN code is the one code it gets wrong).
inline uint16_t e4m3_as_f16(uint8_t b) {
  return static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7Fu) << 7));
}

inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Scale and zero point of tile row c in a slot (the SIMD decoders' formulas).
struct SlotValue {
  float s, z;
};
inline SlotValue slot_value(const QuantLayout& l, const uint8_t* tile, uint32_t slot, int64_t c) {
  const uint8_t* s = tile + slot + 4 * c;
  return {load_f32(s), l.asymmetric ? load_f32(s + 64) : 0.0f};
}

// Value of one code (for int4 / nvfp4 the nibble) under (s, z).
inline float decode_value(WeightFormat f, uint32_t code, SlotValue v) {
  switch (f) {
    case WeightFormat::kInt4:
      return (static_cast<float>(static_cast<int>(code) - 8) - v.z) * v.s;
    case WeightFormat::kNvfp4:
      return e2m1_to_f32(static_cast<uint8_t>(code)) * v.s;
    case WeightFormat::kInt8:
      return (static_cast<float>(static_cast<int8_t>(code)) - v.z) * v.s;
    default:  // kFp8: s holds scale * 256
      return f16_to_f32(e4m3_as_f16(static_cast<uint8_t>(code))) * v.s;
  }
}

// Where a block keeps the code of tile row c at packed position j (linear_quant.h): its byte
// offset, and for 4-bit codes the shift of its nibble. f32 layouts: 4-bit codes interleave four
// rows per 64-byte line, 8-bit codes keep rows whole; q8 layouts: dword lane c of each line.
struct CodePlace {
  int64_t offset;
  int shift;
};
inline CodePlace code_place(bool q8, int64_t row_bytes, int64_t c, int64_t j) {
  if (q8 && row_bytes == 16) return {(j / 8) * 64 + 4 * c + j % 4, 4 * static_cast<int>(j % 8 / 4)};
  if (q8) return {(j / 4) * 64 + 4 * c + j % 4, 0};
  if (row_bytes == 16) return {(c / 4) * 64 + 4 * (j % 16) + c % 4, 4 * static_cast<int>(j / 16)};
  return {c * row_bytes + j, 0};
}

// q8 layouts (linear_quant.h): the offset of a group with zero point z, and the unsigned code
// u of a stored code (int8 is stored as u already; nvfp4 keeps the nibble).
inline float q8_offset(WeightFormat f, int z) {
  if (f == WeightFormat::kInt8) return static_cast<float>(128 + z);
  if (f == WeightFormat::kNvfp4) return 12.0f;
  return static_cast<float>(8 + z);
}
inline int32_t q8_unsigned(WeightFormat f, uint32_t stored) {
  return f == WeightFormat::kNvfp4 ? kQ8Nvfp4Codes[stored] : static_cast<int32_t>(stored);
}

// The stored code of tile row c at position j of a block.
inline uint32_t stored_code(const QuantLayout& l, const uint8_t* block, int64_t c, int64_t j) {
  const int64_t rb = l.row_bytes();
  const CodePlace at = code_place(l.q8, rb, c, j);
  const uint8_t byte = block[at.offset];
  return rb == 16 ? (byte >> at.shift) & 0xFu : byte;
}

// q8 slots: s and off of tile row c (the SIMD kernel's formulas).
inline SlotValue q8_slot(const QuantLayout& l, const uint8_t* tile, uint32_t slot, int64_t c) {
  const uint8_t* at = tile + slot;
  SlotValue v{};
  if (l.e4m3_slots) {
    v.s = f16_to_f32(e4m3_as_f16(at[c])) * l.q8_scale;
  } else {
    v.s = load_f32(at + 4 * c);
  }
  v.z = l.asymmetric ? load_f32(at + 64 + 4 * c) : q8_offset(l.format, 0);
  return v;
}

// Tile row c of block `b` of segment `s` into out[0..32).
void decode_block(const QuantLayout& l, const uint8_t* tile, const QuantSegment& s, int64_t b,
                  int64_t c, float* out) {
  const uint8_t* block = tile + s.codes + b * kQuantRows * l.row_bytes();
  for (int64_t j = 0; j < kQuantK; ++j) {
    const uint32_t code = stored_code(l, block, c, j);
    const uint32_t slot = j < 16 ? s.slot_lo : s.slot_hi;
    if (l.q8) {  // (u - off) * s; for nvfp4 u - off = 2 e2m1, written so that -0 stays -0
      const SlotValue v = q8_slot(l, tile, slot, c);
      const float steps = l.format == WeightFormat::kNvfp4
                              ? 2.0f * e2m1_to_f32(static_cast<uint8_t>(code))
                              : static_cast<float>(q8_unsigned(l.format, code)) - v.z;
      out[j] = steps * v.s;
    } else if (l.e4m3_slots) {  // the table row of the slot's scale code
      out[j] = l.scale_tables()[tile[slot + static_cast<size_t>(c)] * 16 + code];
    } else {
      out[j] = decode_value(l.format, code, slot_value(l, tile, slot, c));
    }
  }
}

// Row `row` of the packed weight in packed order (kp values).
void decode_packed_row(const QuantLayout& l, int64_t row, float* out) {
  const uint8_t* tile = l.tile(row / kQuantRows);
  const QuantSegment* segs = l.segment_table();
  for (int64_t i = 0; i < l.n_segments; ++i) {
    const QuantSegment& s = segs[i];
    for (int64_t b = 0; b < s.n_blocks; ++b)
      decode_block(l, tile, s, b, row % kQuantRows, out + (s.block_begin + b) * kQuantK);
  }
}

}  // namespace

size_t quant_packed_bytes(const WeightTensor& w, bool q8) { return make_plan(w, q8).total; }

void pack_quant(const WeightTensor& w, void* dst, bool q8) {
  const Plan p = make_plan(w, q8);
  const QuantParams& q = w.quant;
  auto* base = static_cast<uint8_t*>(dst);
  std::memset(base, 0, p.total);
  auto& head = *new (base) QuantLayout;
  head.format = w.format;
  head.asymmetric = p.asymmetric;
  head.e4m3_slots = p.e4m3_slots;
  head.per_half = p.per_half;
  head.q8 = p.q8;
  if (p.q8 && p.e4m3_slots) head.q8_scale = q.scale_global * 128.0f;
  head.n_out = w.n_out;
  head.n_in = w.n_in;
  head.kp = p.kp;
  head.n_segments = static_cast<int64_t>(p.segs.size());
  head.tile_bytes = p.tile_bytes;
  head.perm = p.perm_offset;
  head.segments = p.segments_offset;
  head.tiles = p.tiles_offset;
  head.tables = p.tables_offset;
  if (p.e4m3_slots && !p.q8) {
    // Every (scale code, nibble) value, each the f32 products dequantize_row computes.
    auto* table = reinterpret_cast<float*>(base + p.tables_offset);
    for (uint32_t code = 0; code < 256; ++code) {
      const float s = f8e4m3_to_f32(static_cast<uint8_t>(code)) * q.scale_global;
      for (uint32_t i = 0; i < 16; ++i)
        table[code * 16 + i] = e2m1_to_f32(static_cast<uint8_t>(i)) * s;
    }
  }
  if (!p.identity)
    std::memcpy(base + p.perm_offset, p.perm.data(), p.perm.size() * sizeof(int32_t));

  // Segment table: each segment's slot(s), then its blocks, in tile order.
  const int64_t slot_bytes = head.slot_bytes(), rb = head.row_bytes();
  std::vector<QuantSegment> segs;
  uint32_t at = 0;
  for (const Plan::Seg& s : p.segs) {
    QuantSegment out;
    out.block_begin = s.block_begin;
    out.n_blocks = s.n_blocks;
    out.slot_lo = at;
    at += static_cast<uint32_t>(slot_bytes);
    out.slot_hi = out.slot_lo;
    if (p.per_half) {
      out.slot_hi = at;
      at += static_cast<uint32_t>(slot_bytes);
    }
    out.codes = at;
    at += static_cast<uint32_t>(s.n_blocks * kQuantRows * rb);
    segs.push_back(out);
  }
  std::memcpy(base + p.segments_offset, segs.data(), segs.size() * sizeof(QuantSegment));

  // Tiles row by row: the row's codes unpacked, put in packed order (padding: the code of
  // value 0 in its group), then laid out per block.
  const auto* raw_scales = static_cast<const uint8_t*>(q.scales);
  const size_t src_row_bytes = weight_row_bytes(w.format, w.n_in);
  const bool nibbles = rb == 16;
  std::vector<int32_t> pos_group(static_cast<size_t>(p.kp));  // scale group of each position
  for (const Plan::Seg& ps : p.segs) {
    for (int64_t j = 0; j < ps.n_blocks * kQuantK; ++j)
      pos_group[static_cast<size_t>(ps.block_begin * kQuantK + j)] =
          static_cast<int32_t>(j % kQuantK < 16 ? ps.g_lo : ps.g_hi);
  }
  std::vector<uint8_t> unpacked(static_cast<size_t>(w.n_in)), packed(static_cast<size_t>(p.kp));
  const int64_t n_tiles = (w.n_out + kQuantRows - 1) / kQuantRows;
  for (int64_t t = 0; t < n_tiles; ++t) {
    uint8_t* tile = base + p.tiles_offset + static_cast<size_t>(t * p.tile_bytes);
    for (int64_t c = 0; c < kQuantRows; ++c) {
      const int64_t o = t * kQuantRows + c;
      const bool real = o < w.n_out;  // padding rows: scale 0, zero codes
      auto zero_of = [&](int64_t g) -> int {
        return real && q.zeros != nullptr ? q.zeros[o * q.n_groups + g] : 0;
      };
      // The code whose value is 0 (int4: 8 + z, int8: z; fp8 and nvfp4: 0).
      auto zero_code = [&](int64_t g) -> uint8_t {
        if (w.format == WeightFormat::kInt4) return static_cast<uint8_t>(8 + zero_of(g));
        if (w.format == WeightFormat::kInt8) return static_cast<uint8_t>(zero_of(g));
        return 0;
      };
      if (real) {
        const auto* src =
            static_cast<const uint8_t*>(w.data) + static_cast<size_t>(o) * src_row_bytes;
        if (nibbles) {
          for (int64_t k = 0; k < w.n_in; k += 2) {
            unpacked[static_cast<size_t>(k)] = src[k / 2] & 0xF;
            unpacked[static_cast<size_t>(k) + 1] = src[k / 2] >> 4;
          }
        } else {
          std::memcpy(unpacked.data(), src, src_row_bytes);
        }
      }
      for (int64_t pos = 0; pos < p.kp; ++pos) {
        const int32_t col = p.perm[static_cast<size_t>(pos)];
        packed[static_cast<size_t>(pos)] = real && col >= 0
                                               ? unpacked[static_cast<size_t>(col)]
                                               : zero_code(pos_group[static_cast<size_t>(pos)]);
      }
      auto write_slot = [&](uint32_t slot, int64_t g) {
        if (p.e4m3_slots) {
          tile[slot + static_cast<size_t>(c)] = real ? raw_scales[o * q.n_groups + g] : 0;
          return;
        }
        float s = real ? quant_scale(q, o, g) : 0.0f;
        if (w.format == WeightFormat::kFp8) s *= 256.0f;  // the f16 trick's / 256, exactly undone
        if (p.q8 && w.format == WeightFormat::kNvfp4) s *= 0.5f;  // u counts half steps
        std::memcpy(tile + slot + 4 * c, &s, sizeof s);
        if (p.asymmetric) {
          const float z = p.q8 ? q8_offset(w.format, zero_of(g)) : static_cast<float>(zero_of(g));
          std::memcpy(tile + slot + 64 + 4 * c, &z, sizeof z);
        }
      };
      for (size_t i = 0; i < segs.size(); ++i) {
        const Plan::Seg& ps = p.segs[i];
        write_slot(segs[i].slot_lo, ps.g_lo);
        if (p.per_half) write_slot(segs[i].slot_hi, ps.g_hi);
        for (int64_t b = 0; b < ps.n_blocks; ++b) {
          uint8_t* block = tile + segs[i].codes + b * kQuantRows * rb;
          const uint8_t* codes = packed.data() + (ps.block_begin + b) * kQuantK;
          for (int64_t j = 0; j < kQuantK; ++j) {
            const CodePlace place = code_place(p.q8, rb, c, j);
            if (nibbles) {
              block[place.offset] =
                  static_cast<uint8_t>(block[place.offset] | (codes[j] << place.shift));
            } else {  // q8 int8 stores u = q + 128
              block[place.offset] =
                  p.q8 ? static_cast<uint8_t>(codes[j] ^ 0x80u) : static_cast<uint8_t>(codes[j]);
            }
          }
        }
      }
    }
  }
}

void prepare_quant_input(const QuantLayout& l, ConstRows x, int64_t r_begin, int64_t r_end,
                         void* out) {
  if (l.q8) {
    if (q8_simd_enabled()) return quantize_q8_rows_avx512(l, x, r_begin, r_end, out);
    return quantize_q8_rows_portable(l, x, r_begin, r_end, out);
  }
  const int32_t* perm = l.permutation();
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* src = x.row(r);
    float* dst = static_cast<float*>(out) + r * l.kp;
    for (int64_t p = 0; p < l.kp; ++p) dst[p] = perm[p] >= 0 ? src[perm[p]] : 0.0f;
  }
}

void quantize_q8_rows_portable(const QuantLayout& l, ConstRows x, int64_t r_begin, int64_t r_end,
                               void* out) {
  const int32_t* perm = l.permutation();
  const int64_t stride = q8_row_bytes(l.kp);
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* src = x.row(r);
    auto* q = static_cast<int8_t*>(out) + r * stride;
    auto* blocks = reinterpret_cast<Q8Block*>(q + l.kp);
    for (int64_t b = 0; b < l.kp / kQuantK; ++b) {
      float v[kQuantK];
      float amax = 0.0f;
      bool finite = true;
      for (int64_t j = 0; j < kQuantK; ++j) {
        const int64_t p = b * kQuantK + j;
        v[j] = perm == nullptr ? src[p] : perm[p] >= 0 ? src[perm[p]] : 0.0f;
        finite = finite && std::isfinite(v[j]);
        amax = std::max(amax, std::fabs(v[j]));
      }
      Q8Block& out_b = blocks[b];
      int32_t sum[2] = {0, 0};
      const float id = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int64_t j = 0; j < kQuantK; ++j) {
        const auto c = id == 0.0f ? 0 : static_cast<int32_t>(std::nearbyint(v[j] * id));
        q[b * kQuantK + j] = static_cast<int8_t>(c);
        sum[j / 16] += c;
      }
      out_b.d = !finite ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
      out_b.s = static_cast<float>(sum[0] + sum[1]);
      out_b.s_lo = static_cast<float>(sum[0]);
      out_b.s_hi = static_cast<float>(sum[1]);
    }
  }
}

void unpack_quant_row(const QuantLayout& l, int64_t row, float* out) {
  std::vector<float> packed(static_cast<size_t>(l.kp));
  decode_packed_row(l, row, packed.data());
  const int32_t* perm = l.permutation();
  for (int64_t p = 0; p < l.kp; ++p) {
    const int64_t col = perm != nullptr ? perm[p] : p;
    if (col >= 0) out[col] = packed[static_cast<size_t>(p)];
  }
}

void linear_q8_portable(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  const QuantLayout& l = *t.w;
  const int64_t stride = q8_row_bytes(l.kp);
  const QuantSegment* segs = l.segment_table();
  const int64_t rb = l.row_bytes();
  // I = sum of u * q over positions [j0, j1) of a block.
  auto dot = [&](const uint8_t* block, int64_t c, const int8_t* q, int64_t j0, int64_t j1) {
    int32_t sum = 0;
    for (int64_t j = j0; j < j1; ++j)
      sum += q8_unsigned(l.format, stored_code(l, block, c, j)) * static_cast<int32_t>(q[j]);
    return static_cast<float>(sum);
  };
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* tile = l.tile(o / kQuantRows);
    const int64_t c = o % kQuantRows;
    for (int64_t r = 0; r < t.x.n_rows; ++r) {
      const auto* q = reinterpret_cast<const int8_t*>(t.x8 + r * stride);
      const auto* blocks = reinterpret_cast<const Q8Block*>(q + l.kp);
      float acc = 0.0f;
      for (int64_t i = 0; i < l.n_segments; ++i) {
        const QuantSegment& s = segs[i];
        const uint8_t* codes = tile + s.codes;
        if (l.per_half) {
          const int64_t b = s.block_begin;
          const Q8Block& x = blocks[b];
          const SlotValue lo = q8_slot(l, tile, s.slot_lo, c), hi = q8_slot(l, tile, s.slot_hi, c);
          const float t_lo = dot(codes, c, q + b * kQuantK, 0, 16) - lo.z * x.s_lo;
          const float t_hi = dot(codes, c, q + b * kQuantK, 16, 32) - hi.z * x.s_hi;
          acc = std::fma(std::fma(t_lo, x.d, 0.0f), lo.s, acc);
          acc = std::fma(std::fma(t_hi, x.d, 0.0f), hi.s, acc);
          continue;
        }
        const SlotValue v = q8_slot(l, tile, s.slot_lo, c);
        float g = 0.0f;
        for (int64_t k = 0; k < s.n_blocks; ++k) {
          const int64_t b = s.block_begin + k;
          const float tb =
              dot(codes + k * kQuantRows * rb, c, q + b * kQuantK, 0, 32) - v.z * blocks[b].s;
          g = std::fma(tb, blocks[b].d, g);
        }
        acc = std::fma(g, v.s, acc);
      }
      if (t.bias != nullptr) acc += t.bias[o];
      t.y.row(r)[o] = acc;
    }
  }
}

void linear_quant_portable(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  const QuantLayout& l = *t.w;
  if (l.q8) return linear_q8_portable(t, o_begin, o_end);
  // One packed row at a time; grows once per thread.
  thread_local std::vector<float> wrow;
  if (wrow.size() < static_cast<size_t>(l.kp)) wrow.resize(static_cast<size_t>(l.kp));
  for (int64_t o = o_begin; o < o_end; ++o) {
    decode_packed_row(l, o, wrow.data());
    for (int64_t r = 0; r < t.x.n_rows; ++r) {
      const float* x = t.x.row(r);
      float acc[16] = {};
      for (int64_t p = 0; p < l.kp; p += 16) {
        for (int64_t i = 0; i < 16; ++i)
          acc[i] = std::fma(x[p + i], wrow[static_cast<size_t>(p + i)], acc[i]);
      }
      // The fixed tree of linear_quant.h (the AVX-512 kernel's shuffles).
      for (int64_t half = 8; half >= 1; half /= 2)
        for (int64_t i = 0; i < half; ++i) acc[i] = acc[i] + acc[i + half];
      float s = acc[0];
      if (t.bias != nullptr) s += t.bias[o];
      t.y.row(r)[o] = s;
    }
  }
}

}  // namespace metrale::cpu
