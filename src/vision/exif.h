#pragma once
// EXIF orientation: finding it (EXIF TIFF blocks, XMP packets) and applying it exactly as
// PIL's ImageOps.exif_transpose does, so rotated phone photos reach the model upright.
#include <cstdint>
#include <span>
#include <string_view>

#include "vision/image.h"

namespace metrale::vision {

// Orientation tag (0x0112) of IFD0 in an EXIF block, with or without the "Exif\0\0" prefix.
// Returns 0 when the block has no usable tag; malformed blocks are ignored, not errors
// (metadata must never make a decodable image undecodable).
int exif_orientation(std::span<const uint8_t> exif);

// PIL's XMP fallback: the first `tiff:Orientation="N"` or `tiff:Orientation>N`; 0 if none.
int xmp_orientation(std::string_view xmp);

// Transposes per orientation 2..8 (PIL: 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM,
// 5 TRANSPOSE, 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90); other values return `image`.
Image apply_orientation(Image image, int orientation);

}  // namespace metrale::vision
