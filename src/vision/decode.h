#pragma once
// Still-image decoding: outside bytes (a data URI, bare base64, or raw file bytes) to one RGB8
// Image whose pixels equal PIL's `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`.
// The format comes from the magic bytes, never from a stated MIME type or file name, and
// every dimension is checked against DecodeLimits before a pixel buffer is allocated.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "vision/image.h"

namespace metrale::vision {

enum class ImageFormat { kUnknown, kJpeg, kPng, kGif, kWebp, kBmp };

// "JPEG", "PNG", ... for messages.
std::string_view format_name(ImageFormat format);

struct DecodeLimits {
  int max_side = 32768;
  // PIL raises DecompressionBombError above 2 * MAX_IMAGE_PIXELS (2 * 89478485).
  int64_t max_pixels = 178956970;
  bool apply_exif_orientation = true;
};

// `data:image/png;base64,....` or bare base64 -> bytes. Strict RFC 4648 alphabet with '='
// padding (missing final padding is accepted, as browsers emit it); ASCII whitespace is
// skipped. Anything else -> Error naming the offset into the input.
std::vector<uint8_t> decode_base64_payload(std::string_view data_uri_or_base64);

// Format from the leading bytes only.
ImageFormat sniff_format(std::span<const uint8_t> bytes);

// Decodes the first frame of any supported still format to RGB8, applying the EXIF
// orientation (JPEG APP1, PNG eXIf / raw-profile text, WebP EXIF, or XMP tiff:Orientation).
Image decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits = {});

// Throws unless width x height is positive and within `limits`; `what` names the source.
void check_dimensions(int64_t width, int64_t height, const DecodeLimits& limits,
                      std::string_view what);

}  // namespace metrale::vision
