#pragma once
// Per-format decoders behind decode_image(). Each returns RGB8 pixels converted as PIL's
// Image.convert("RGB") does, plus the orientation found in the file's metadata (1 = none);
// decode_image() applies the orientation and the dimension limits in one place.
#include <cstdint>
#include <span>
#include <string_view>

#include "vision/decode.h"

namespace metrale::vision::detail {

struct DecodedStill {
  Image image;
  int orientation = 1;  // EXIF Orientation, 1..8
};

DecodedStill decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits);
DecodedStill decode_png(std::span<const uint8_t> bytes, const DecodeLimits& limits);
DecodedStill decode_gif_first_frame(std::span<const uint8_t> bytes, const DecodeLimits& limits);
DecodedStill decode_webp(std::span<const uint8_t> bytes, const DecodeLimits& limits);
DecodedStill decode_bmp(std::span<const uint8_t> bytes, const DecodeLimits& limits);

// PIL's CMYK -> RGB (Convert.c cmyk2rgb): r = (255 - k) - (c * (255 - k)) / 255, rounded the
// way PIL's MULDIV255 rounds.
inline uint8_t cmyk_channel(int c, int k) {
  const int nk = 255 - k;
  int tmp = c * nk + 128;
  const int v = nk - (((tmp >> 8) + tmp) >> 8);
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Allocates width x height RGB8 after check_dimensions().
Image new_image(int64_t width, int64_t height, const DecodeLimits& limits, std::string_view what);

}  // namespace metrale::vision::detail
