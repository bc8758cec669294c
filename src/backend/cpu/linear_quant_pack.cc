// Quantized weights: packing (prepare time), the input gather, and the portable kernel. The
// layout and the summation order are in linear_quant.h; the AVX-512 kernel is linear_quant.cc.
// The scalar decode here is the twin of the SIMD decoders, formula for formula (the fp8 f16
// trick and NVFP4's scale tables included), so the portable kernel gives the AVX-512 kernel's
// bits.
#include <algorithm>
#include <cmath>
#include <cstring>
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
  bool per_half = false, identity = false, asymmetric = false, e4m3_slots = false;
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

Plan make_plan(const WeightTensor& w) {
  const QuantParams& q = w.quant;
  if (w.format == WeightFormat::kFp8) check_fp8(w);
  Plan p;
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
  if (p.e4m3_slots) {
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

// Byte offset inside a block of the code of tile row c at packed position j (linear_quant.h):
// 4-bit codes interleave four rows per 64-byte line, 8-bit codes keep rows whole.
inline int64_t code_offset(int64_t row_bytes, int64_t c, int64_t j) {
  if (row_bytes == 16) return (c / 4) * 64 + 4 * (j % 16) + c % 4;
  return c * row_bytes + j;
}

// Tile row c of block `b` of segment `s` into out[0..32).
void decode_block(const QuantLayout& l, const uint8_t* tile, const QuantSegment& s, int64_t b,
                  int64_t c, float* out) {
  const int64_t rb = l.row_bytes();
  const uint8_t* block = tile + s.codes + b * kQuantRows * rb;
  for (int64_t j = 0; j < kQuantK; ++j) {
    const uint8_t byte = block[code_offset(rb, c, j)];
    const uint32_t code = rb == 16 ? (byte >> (4 * (j / 16))) & 0xFu : byte;
    const uint32_t slot = j < 16 ? s.slot_lo : s.slot_hi;
    if (l.e4m3_slots) {  // the table row of the slot's scale code
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

size_t quant_packed_bytes(const WeightTensor& w) { return make_plan(w).total; }

void pack_quant(const WeightTensor& w, void* dst) {
  const Plan p = make_plan(w);
  const QuantParams& q = w.quant;
  auto* base = static_cast<uint8_t*>(dst);
  std::memset(base, 0, p.total);
  auto& head = *new (base) QuantLayout;
  head.format = w.format;
  head.asymmetric = p.asymmetric;
  head.e4m3_slots = p.e4m3_slots;
  head.per_half = p.per_half;
  head.n_out = w.n_out;
  head.n_in = w.n_in;
  head.kp = p.kp;
  head.n_segments = static_cast<int64_t>(p.segs.size());
  head.tile_bytes = p.tile_bytes;
  head.perm = p.perm_offset;
  head.segments = p.segments_offset;
  head.tiles = p.tiles_offset;
  head.tables = p.tables_offset;
  if (p.e4m3_slots) {
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
        std::memcpy(tile + slot + 4 * c, &s, sizeof s);
        if (p.asymmetric) {
          const auto z = static_cast<float>(zero_of(g));
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
          if (nibbles) {
            for (int64_t j = 0; j < 16; ++j)
              block[code_offset(rb, c, j)] = static_cast<uint8_t>(codes[j] | (codes[j + 16] << 4));
          } else {
            std::memcpy(block + code_offset(rb, c, 0), codes, kQuantK);
          }
        }
      }
    }
  }
}

void gather_quant_input(const QuantLayout& l, ConstRows x, int64_t r_begin, int64_t r_end,
                        float* out) {
  const int32_t* perm = l.permutation();
  for (int64_t r = r_begin; r < r_end; ++r) {
    const float* src = x.row(r);
    float* dst = out + r * l.kp;
    for (int64_t p = 0; p < l.kp; ++p) dst[p] = perm[p] >= 0 ? src[perm[p]] : 0.0f;
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

void linear_quant_portable(const QuantTask& t, int64_t o_begin, int64_t o_end) {
  const QuantLayout& l = *t.w;
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
