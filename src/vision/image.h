#pragma once
// A decoded still image: 8-bit RGB, row-major, no padding. Every decoder converts to this
// (grey, alpha and palette images converted as PIL's Image.convert("RGB") does), so geometry
// and normalisation code sees one layout.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace metrale::vision {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]

  uint8_t* row(int y) { return rgb.data() + static_cast<size_t>(y) * width * 3; }
  const uint8_t* row(int y) const { return rgb.data() + static_cast<size_t>(y) * width * 3; }
};

}  // namespace metrale::vision
