#include <gtest/gtest.h>

#include <vector>

#include "vision/exif.h"

namespace metrale::vision {
namespace {

// A minimal TIFF block with one IFD0 entry.
std::vector<uint8_t> tiff(bool big_endian, uint16_t tag, uint16_t type, uint32_t count,
                          uint32_t value, bool exif_prefix) {
  std::vector<uint8_t> b;
  if (exif_prefix) b = {'E', 'x', 'i', 'f', 0, 0};
  auto u16 = [&](uint32_t v) {
    if (big_endian)
      b.insert(b.end(), {uint8_t(v >> 8), uint8_t(v)});
    else
      b.insert(b.end(), {uint8_t(v), uint8_t(v >> 8)});
  };
  auto u32 = [&](uint32_t v) {
    if (big_endian)
      u16(v >> 16), u16(v & 0xFFFF);
    else
      u16(v & 0xFFFF), u16(v >> 16);
  };
  if (big_endian)
    b.insert(b.end(), {'M', 'M', 0, 42});
  else
    b.insert(b.end(), {'I', 'I', 42, 0});
  u32(8);
  u16(1);
  u16(tag), u16(type), u32(count);
  if (type == 3)
    u16(value), u16(0);
  else
    u32(value);
  u32(0);
  return b;
}

TEST(ExifOrientation, ReadsBothByteOrdersWithAndWithoutPrefix) {
  for (bool be : {false, true}) {
    for (bool prefix : {false, true}) {
      for (uint32_t o = 1; o <= 8; ++o) {
        EXPECT_EQ(exif_orientation(tiff(be, 0x0112, 3, 1, o, prefix)), int(o));
      }
    }
  }
  EXPECT_EQ(exif_orientation(tiff(false, 0x0112, 4, 1, 6, true)), 6);  // LONG
}

TEST(ExifOrientation, IgnoresOtherTagsBadCountsAndGarbage) {
  EXPECT_EQ(exif_orientation(tiff(false, 0x0110, 3, 1, 6, true)), 0);
  EXPECT_EQ(exif_orientation(tiff(false, 0x0112, 3, 2, 6, true)), 0);
  auto block = tiff(true, 0x0112, 3, 1, 6, true);
  for (size_t cut = 0; cut < block.size() - 6; ++cut) {
    EXPECT_EQ(exif_orientation(std::span(block.data(), cut)), 0) << cut;
  }
  std::vector<uint8_t> bad_offset = tiff(false, 0x0112, 3, 1, 6, false);
  bad_offset[4] = 0xF0;  // IFD0 offset past the end
  EXPECT_EQ(exif_orientation(bad_offset), 0);
  EXPECT_EQ(exif_orientation({}), 0);
}

TEST(XmpOrientation, MatchesPilPatterns) {
  EXPECT_EQ(xmp_orientation(R"(<rdf:Description tiff:Orientation="6"/>)"), 6);
  EXPECT_EQ(xmp_orientation("<tiff:Orientation>8</tiff:Orientation>"), 8);
  EXPECT_EQ(xmp_orientation("<tiff:Orientation> 8</tiff:Orientation>"), 0);
  EXPECT_EQ(xmp_orientation("no orientation here"), 0);
}

Image numbered(int w, int h) {
  Image im;
  im.width = w;
  im.height = h;
  for (int i = 0; i < w * h; ++i) im.rgb.insert(im.rgb.end(), {uint8_t(i), uint8_t(100 + i), 7});
  return im;
}

// Pixel ids (red channel) row by row.
std::vector<int> ids(const Image& im) {
  std::vector<int> v;
  for (size_t i = 0; i < im.rgb.size(); i += 3) v.push_back(im.rgb[i]);
  return v;
}

TEST(ApplyOrientation, MatchesPilTransposes) {
  // 3x2 source:  0 1 2
  //              3 4 5
  const Image src = numbered(3, 2);
  EXPECT_EQ(ids(apply_orientation(src, 1)), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(ids(apply_orientation(src, 2)), (std::vector<int>{2, 1, 0, 5, 4, 3}));
  EXPECT_EQ(ids(apply_orientation(src, 3)), (std::vector<int>{5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(ids(apply_orientation(src, 4)), (std::vector<int>{3, 4, 5, 0, 1, 2}));
  EXPECT_EQ(ids(apply_orientation(src, 5)), (std::vector<int>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(ids(apply_orientation(src, 6)), (std::vector<int>{3, 0, 4, 1, 5, 2}));
  EXPECT_EQ(ids(apply_orientation(src, 7)), (std::vector<int>{5, 2, 4, 1, 3, 0}));
  EXPECT_EQ(ids(apply_orientation(src, 8)), (std::vector<int>{2, 5, 1, 4, 0, 3}));
  for (int o = 5; o <= 8; ++o) {
    const Image t = apply_orientation(src, o);
    EXPECT_EQ(t.width, 2);
    EXPECT_EQ(t.height, 3);
    EXPECT_EQ(t.rgb[1], t.rgb[0] + 100);  // channels travel together
  }
  EXPECT_EQ(ids(apply_orientation(apply_orientation(src, 6), 8)), ids(src));
  EXPECT_EQ(ids(apply_orientation(src, 0)), ids(src));
  EXPECT_EQ(ids(apply_orientation(src, 9)), ids(src));
}

}  // namespace
}  // namespace metrale::vision
