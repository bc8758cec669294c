// Format detection from magic bytes. A client's MIME type or file name is advisory at best
// (browsers label WebP as image/png, users rename files), so only the bytes decide.
#include <cstring>

#include "vision/decode.h"

namespace metrale::vision {

std::string_view format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

ImageFormat sniff_format(std::span<const uint8_t> b) {
  auto starts = [&](const char* magic, size_t n, size_t at = 0) {
    return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
  };
  if (starts("\xFF\xD8\xFF", 3)) return ImageFormat::kJpeg;
  if (starts("\x89PNG\r\n\x1A\n", 8)) return ImageFormat::kPng;
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return ImageFormat::kGif;
  if (starts("RIFF", 4) && starts("WEBP", 4, 8)) return ImageFormat::kWebp;
  if (starts("BM", 2)) return ImageFormat::kBmp;
  return ImageFormat::kUnknown;
}

}  // namespace metrale::vision
