// EXIF/XMP orientation. The TIFF walk reads only IFD0's entry table, bounds-checked at every
// step, because that is all exif_transpose() consults.
#include "vision/exif.h"

#include <cstring>
#include <utility>

namespace metrale::vision {
namespace {

constexpr uint16_t kOrientationTag = 0x0112;

struct TiffReader {
  std::span<const uint8_t> d;
  bool big_endian;
  bool has(size_t at, size_t n) const { return at <= d.size() && n <= d.size() - at; }
  uint32_t u16(size_t at) const {
    return big_endian ? (d[at] << 8 | d[at + 1]) : (d[at + 1] << 8 | d[at]);
  }
  uint32_t u32(size_t at) const {
    return big_endian ? (u16(at) << 16 | u16(at + 2)) : (u16(at + 2) << 16 | u16(at));
  }
};

}  // namespace

int exif_orientation(std::span<const uint8_t> exif) {
  if (exif.size() >= 6 && std::memcmp(exif.data(), "Exif\0\0", 6) == 0) exif = exif.subspan(6);
  if (exif.size() < 8) return 0;
  TiffReader r{exif, false};
  if (std::memcmp(exif.data(), "MM\0*", 4) == 0) {
    r.big_endian = true;
  } else if (std::memcmp(exif.data(), "II*\0", 4) != 0) {
    return 0;
  }
  const size_t ifd = r.u32(4);
  if (!r.has(ifd, 2)) return 0;
  const size_t count = r.u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + i * 12;
    if (!r.has(e, 12)) return 0;
    if (r.u16(e) != kOrientationTag) continue;
    const uint32_t type = r.u16(e + 2);
    if (r.u32(e + 4) != 1) return 0;  // PIL yields a tuple, which maps to no transpose
    switch (type) {
      case 1:
      case 6:
      case 7:
        return exif[e + 8];  // BYTE, SBYTE, UNDEFINED
      case 3:
      case 8:
        return static_cast<int>(r.u16(e + 8));  // SHORT, SSHORT
      case 4:
      case 9:
        return static_cast<int>(r.u32(e + 8) & 0xFFFF);  // LONG, SLONG
      default:
        return 0;
    }
  }
  return 0;
}

int xmp_orientation(std::string_view xmp) {
  constexpr std::string_view kKey = "tiff:Orientation";
  for (size_t at = xmp.find(kKey); at != std::string_view::npos; at = xmp.find(kKey, at + 1)) {
    std::string_view rest = xmp.substr(at + kKey.size());
    if (rest.size() >= 3 && rest[0] == '=' && rest[1] == '"' && rest[2] >= '0' && rest[2] <= '9')
      return rest[2] - '0';
    if (rest.size() >= 2 && rest[0] == '>' && rest[1] >= '0' && rest[1] <= '9')
      return rest[1] - '0';
  }
  return 0;
}

Image apply_orientation(Image in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int w = in.width, h = in.height;
  const bool swap = orientation >= 5;
  Image out;
  out.width = swap ? h : w;
  out.height = swap ? w : h;
  out.rgb.resize(in.rgb.size());
  // Source pixel for output (x, y), per PIL's Transpose methods.
  auto source = [&](int x, int y) -> std::pair<int, int> {
    switch (orientation) {
      case 2:
        return {w - 1 - x, y};
      case 3:
        return {w - 1 - x, h - 1 - y};
      case 4:
        return {x, h - 1 - y};
      case 5:
        return {y, x};
      case 6:
        return {y, h - 1 - x};
      case 7:
        return {w - 1 - y, h - 1 - x};
      default:
        return {w - 1 - y, x};  // 8
    }
  };
  for (int y = 0; y < out.height; ++y) {
    uint8_t* dst = out.row(y);
    for (int x = 0; x < out.width; ++x) {
      auto [sx, sy] = source(x, y);
      std::memcpy(dst + 3 * x, in.row(sy) + 3 * sx, 3);
    }
  }
  return out;
}

}  // namespace metrale::vision
