// Still-image decoding against PIL: every fixture listed in tests/data/vision/decoded/
// manifest.json must decode to exactly PIL's exif_transpose(...).convert("RGB") pixels, and
// every bad file must fail with an Error (never crash, hang or return an image).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"
#include "vision/decode.h"

namespace metrale::vision {
namespace {

using test::read_file;

nlohmann::json manifest() {
  std::ifstream f("tests/data/vision/decoded/manifest.json");
  EXPECT_TRUE(f.good());
  return nlohmann::json::parse(f);
}

TEST(DecodeImage, MatchesPilPixelsExactly) {
  const auto m = manifest();
  ASSERT_GE(m["images"].size(), 30u);
  for (const auto& entry : m["images"]) {
    const std::string path = entry["image"];
    SCOPED_TRACE(path + " (" + entry["note"].get<std::string>() + ")");
    const std::vector<uint8_t> bytes = read_file(path);
    Image image;
    try {
      image = decode_image(bytes);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    ASSERT_EQ(image.width, entry["width"].get<int>());
    ASSERT_EQ(image.height, entry["height"].get<int>());
    const std::vector<uint8_t> want = read_file(entry["reference"]);
    ASSERT_EQ(image.rgb.size(), want.size());
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (image.rgb[i] != want[i] && mismatches++ == 0) first = i;
    }
    EXPECT_EQ(mismatches, 0u) << "first at byte " << first << " (pixel " << first / 3 << "): got "
                              << int(image.rgb[first]) << ", PIL " << int(want[first]);
  }
}

TEST(DecodeImage, BadFilesGiveErrors) {
  const auto m = manifest();
  ASSERT_GE(m["bad"].size(), 15u);
  for (const auto& entry : m["bad"]) {
    const std::string path = entry["image"];
    SCOPED_TRACE(path + " (" + entry["note"].get<std::string>() + ")");
    const std::vector<uint8_t> bytes = read_file(path);
    try {
      Image image = decode_image(bytes);
      ADD_FAILURE() << "decoded to " << image.width << "x" << image.height;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(entry["expect"].get<std::string>()), std::string::npos)
          << e.what();
    }
  }
}

TEST(DecodeImage, EveryTruncationOfEveryFormatIsAnErrorOrAnImage) {
  // Cutting files at many points must never crash; most cuts must be reported.
  for (const char* name : {"photo_progressive.jpg", "grey.png", "static.gif", "webp_lossy.webp",
                           "bmp8_palette.bmp", "exif_orient6.jpg"}) {
    const auto bytes = read_file(std::string("tests/data/vision/images/") + name);
    size_t errors = 0, cuts = 0;
    for (size_t cut = 0; cut < bytes.size(); cut += 1 + bytes.size() / 97) {
      ++cuts;
      try {
        decode_image(std::span(bytes.data(), cut));
      } catch (const Error&) {
        ++errors;
      }
    }
    EXPECT_EQ(errors, cuts) << name;
  }
}

TEST(DecodeImage, LimitsAreCheckedBeforeDecoding) {
  const auto bytes = read_file("tests/data/vision/images/photo_chelsea.jpg");
  DecodeLimits tight{.max_side = 400};
  EXPECT_THROW(decode_image(bytes, tight), Error);
  DecodeLimits few{.max_pixels = 1000};
  try {
    decode_image(bytes, few);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("451x300"), std::string::npos) << e.what();
  }
  EXPECT_EQ(decode_image(bytes, DecodeLimits{.max_side = 451}).width, 451);
}

TEST(DecodeImage, ExifOrientationCanBeSkipped) {
  const auto bytes = read_file("tests/data/vision/images/exif_orient6.jpg");
  const Image upright = decode_image(bytes);
  const Image raw = decode_image(bytes, DecodeLimits{.apply_exif_orientation = false});
  EXPECT_EQ(upright.width, raw.height);
  EXPECT_EQ(upright.height, raw.width);
}

TEST(SniffFormat, UsesMagicBytesOnly) {
  using namespace std::string_view_literals;
  auto sniff = [](std::string_view s) {
    return sniff_format({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  };
  EXPECT_EQ(sniff("\xFF\xD8\xFF\xE0"sv), ImageFormat::kJpeg);
  EXPECT_EQ(sniff("\x89PNG\r\n\x1A\nxxxx"sv), ImageFormat::kPng);
  EXPECT_EQ(sniff("GIF87a"sv), ImageFormat::kGif);
  EXPECT_EQ(sniff("GIF89a"sv), ImageFormat::kGif);
  EXPECT_EQ(sniff("RIFF\0\0\0\0WEBPVP8 "sv), ImageFormat::kWebp);
  EXPECT_EQ(sniff("RIFF\0\0\0\0WAVEfmt "sv), ImageFormat::kUnknown);
  EXPECT_EQ(sniff("BM"sv), ImageFormat::kBmp);
  EXPECT_EQ(sniff("\xFF\xD8"sv), ImageFormat::kUnknown);
  EXPECT_EQ(sniff(""sv), ImageFormat::kUnknown);
  EXPECT_EQ(sniff_format(read_file("tests/data/vision/images/png_named_jpg.jpg")),
            ImageFormat::kPng);
  EXPECT_EQ(format_name(ImageFormat::kWebp), "WebP");
}

TEST(DecodeImage, EmptyInputIsAnError) { EXPECT_THROW(decode_image({}), Error); }

}  // namespace
}  // namespace metrale::vision
