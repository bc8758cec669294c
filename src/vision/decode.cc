// decode_image(): sniff, dispatch to the format's decoder, apply the EXIF orientation.
#include "vision/decode.h"

#include "core/error.h"
#include "vision/decode_internal.h"
#include "vision/exif.h"

namespace metrale::vision {

void check_dimensions(int64_t width, int64_t height, const DecodeLimits& limits,
                      std::string_view what) {
  METRALE_CHECK(width > 0 && height > 0, what, ": image size ", width, "x", height,
                " has a zero or negative side");
  METRALE_CHECK(width <= limits.max_side && height <= limits.max_side, what, ": image size ", width,
                "x", height, " exceeds the maximum side of ", limits.max_side, " pixels");
  METRALE_CHECK(width * height <= limits.max_pixels, what, ": image size ", width, "x", height,
                " = ", width * height, " pixels exceeds the limit of ", limits.max_pixels,
                " (decompression bomb?)");
}

namespace detail {
Image new_image(int64_t width, int64_t height, const DecodeLimits& limits, std::string_view what) {
  check_dimensions(width, height, limits, what);
  Image image;
  image.width = static_cast<int>(width);
  image.height = static_cast<int>(height);
  image.rgb.assign(static_cast<size_t>(width * height) * 3, 0);
  return image;
}
}  // namespace detail

Image decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  METRALE_CHECK(!bytes.empty(), "image: empty input (0 bytes)");
  const ImageFormat format = sniff_format(bytes);
  detail::DecodedStill still;
  switch (format) {
    case ImageFormat::kJpeg:
      still = detail::decode_jpeg(bytes, limits);
      break;
    case ImageFormat::kPng:
      still = detail::decode_png(bytes, limits);
      break;
    case ImageFormat::kGif:
      still = detail::decode_gif_first_frame(bytes, limits);
      break;
    case ImageFormat::kWebp:
      still = detail::decode_webp(bytes, limits);
      break;
    case ImageFormat::kBmp:
      still = detail::decode_bmp(bytes, limits);
      break;
    case ImageFormat::kUnknown: {
      std::string head;
      for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
        head +=
            metrale::detail::concat(i ? " " : "", std::hex, int(bytes[i] >> 4), int(bytes[i] & 15));
      }
      throw make_error("image: unknown image format (leading bytes ", head,
                       "); expected JPEG, PNG, GIF, WebP or BMP");
    }
  }
  if (!limits.apply_exif_orientation) return std::move(still.image);
  return apply_orientation(std::move(still.image), still.orientation);
}

}  // namespace metrale::vision
