// A small BMP reader covering what real uploads use: BITMAPCOREHEADER and BITMAPINFOHEADER
// (v1-v5), 1/4/8-bit palettes, 24-bit, and 32-bit BI_RGB or BI_BITFIELDS with byte-aligned
// masks; bottom-up and top-down. Layout rules follow PIL's BmpImagePlugin (palette right
// after the header, pixel data at bfOffBits). RLE and 16-bit are refused with an Error.
#include <array>
#include <bit>
#include <cstring>

#include "core/error.h"
#include "vision/decode_internal.h"

namespace metrale::vision::detail {
namespace {

struct Reader {
  std::span<const uint8_t> d;
  void need(size_t at, size_t n, const char* what) const {
    METRALE_CHECK(at <= d.size() && n <= d.size() - at, "BMP: truncated file: ", what,
                  " needs bytes [", at, ", ", at + n, ") but the file has ", d.size());
  }
  uint32_t u16(size_t at) const { return d[at] | d[at + 1] << 8; }
  uint32_t u32(size_t at) const { return u16(at) | u16(at + 2) << 16; }
};

constexpr uint32_t kRgb = 0, kBitfields = 3;

}  // namespace

DecodedStill decode_bmp(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  Reader r{bytes};
  r.need(0, 18, "file header");
  uint32_t data_offset = r.u32(10);
  const uint32_t header_size = r.u32(14);
  int64_t width = 0, height = 0;
  uint32_t bits = 0, compression = kRgb, colors = 0, palette_entry = 4;
  bool top_down = false;
  uint32_t masks[3] = {0xFF0000, 0xFF00, 0xFF};
  size_t after_header = 14 + size_t(header_size);
  if (header_size == 12) {
    r.need(14, 12, "BITMAPCOREHEADER");
    width = r.u16(18);
    height = r.u16(20);
    bits = r.u16(24);
    palette_entry = 3;
  } else if (header_size == 40 || header_size == 52 || header_size == 56 || header_size == 64 ||
             header_size == 108 || header_size == 124) {
    r.need(14, header_size, "BITMAPINFOHEADER");
    width = static_cast<int32_t>(r.u32(18));
    const int32_t h = static_cast<int32_t>(r.u32(22));
    top_down = h < 0;
    height = top_down ? -int64_t(h) : h;
    bits = r.u16(28);
    compression = r.u32(30);
    colors = r.u32(46);
    if (compression == kBitfields) {
      size_t at = 54;
      if (header_size == 40) {  // masks follow the 40-byte header
        r.need(54, 12, "bitfield masks");
        after_header += 12;
      }
      for (auto& m : masks) m = r.u32(at), at += 4;
    }
  } else {
    throw make_error("BMP: unsupported header size ", header_size,
                     " (expected 12, 40, 52, 56, 64, 108 or 124)");
  }
  METRALE_CHECK(compression == kRgb || (compression == kBitfields && bits == 32),
                "BMP: unsupported compression ", compression, " with ", bits,
                "-bit pixels (supported: uncompressed, or 32-bit bitfields)");
  METRALE_CHECK(bits == 1 || bits == 4 || bits == 8 || bits == 24 || bits == 32,
                "BMP: unsupported bit depth ", bits, " (supported: 1, 4, 8, 24, 32)");
  DecodedStill still;
  still.image = new_image(width, height, limits, "BMP");

  std::vector<std::array<uint8_t, 3>> palette;
  if (bits <= 8) {
    if (colors == 0) colors = 1u << bits;
    METRALE_CHECK(colors <= 65536, "BMP: palette size ", colors, " exceeds 65536");
    if (data_offset == after_header) data_offset += palette_entry * colors;  // PIL's fix-up
    r.need(after_header, size_t(palette_entry) * colors, "palette");
    for (uint32_t i = 0; i < colors; ++i) {
      const uint8_t* p = &bytes[after_header + size_t(i) * palette_entry];
      palette.push_back({p[2], p[1], p[0]});
    }
  }
  int shifts[3];
  for (int c = 0; c < 3; ++c) {
    const uint32_t m = masks[c];
    shifts[c] = std::countr_zero(m);
    METRALE_CHECK(m != 0 && (m >> shifts[c]) == 0xFF, "BMP: unsupported bitfield mask 0x", std::hex,
                  m, " (only 8-bit channel masks)");
  }
  const size_t stride = (size_t(width) * bits + 31) / 32 * 4;
  r.need(data_offset, stride * size_t(height), "pixel data");
  for (int64_t y = 0; y < height; ++y) {
    const uint8_t* in = &bytes[data_offset + stride * size_t(top_down ? y : height - 1 - y)];
    uint8_t* out = still.image.row(int(y));
    for (int64_t x = 0; x < width; ++x, out += 3) {
      if (bits == 24) {
        out[0] = in[3 * x + 2], out[1] = in[3 * x + 1], out[2] = in[3 * x];
      } else if (bits == 32) {
        const uint32_t v =
            in[4 * x] | in[4 * x + 1] << 8 | in[4 * x + 2] << 16 | uint32_t(in[4 * x + 3]) << 24;
        for (int c = 0; c < 3; ++c) out[c] = uint8_t(v >> shifts[c]);
      } else {
        const size_t bit = size_t(x) * bits;
        const uint32_t index = (in[bit / 8] >> (8 - bits - bit % 8)) & ((1u << bits) - 1);
        // PIL leaves indices past the palette black.
        const std::array<uint8_t, 3> c =
            index < palette.size() ? palette[index] : std::array<uint8_t, 3>{0, 0, 0};
        std::memcpy(out, c.data(), 3);
      }
    }
  }
  return still;
}

}  // namespace metrale::vision::detail
