#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "vision/decode.h"

namespace metrale::vision {
namespace {

std::string str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

std::string error_of(std::string_view input) {
  try {
    decode_base64_payload(input);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Base64, DecodesRfc4648Vectors) {
  EXPECT_EQ(str(decode_base64_payload("Zg==")), "f");
  EXPECT_EQ(str(decode_base64_payload("Zm8=")), "fo");
  EXPECT_EQ(str(decode_base64_payload("Zm9v")), "foo");
  EXPECT_EQ(str(decode_base64_payload("Zm9vYg==")), "foob");
  EXPECT_EQ(str(decode_base64_payload("Zm9vYmE=")), "fooba");
  EXPECT_EQ(str(decode_base64_payload("Zm9vYmFy")), "foobar");
}

TEST(Base64, AcceptsDataUrisWhitespaceAndMissingPadding) {
  EXPECT_EQ(str(decode_base64_payload("data:image/png;base64,Zm9vYmFy")), "foobar");
  EXPECT_EQ(str(decode_base64_payload("DATA:image/jpeg;name=x.jpg;BASE64,Zm9v")), "foo");
  EXPECT_EQ(str(decode_base64_payload("Zm9v\r\nYmFy\n")), "foobar");
  EXPECT_EQ(str(decode_base64_payload("Zm9vYg")), "foob");
  EXPECT_EQ(str(decode_base64_payload("Zm9vYmE")), "fooba");
}

TEST(Base64, AllByteValuesRoundTrip) {
  // "+" and "/" appear for these bytes; decode what Python's base64 would produce.
  EXPECT_EQ(decode_base64_payload("+/8A"), (std::vector<uint8_t>{0xFB, 0xFF, 0x00}));
}

TEST(Base64, RejectsBadInputNamingTheOffset) {
  EXPECT_NE(error_of("Zm9v!mFy").find("offset 4"), std::string::npos) << error_of("Zm9v!mFy");
  EXPECT_NE(error_of("Zm9v-_Fy").find("offset 4"), std::string::npos);
  EXPECT_NE(error_of("Zm=9").find("offset 3"), std::string::npos) << error_of("Zm=9");
  EXPECT_NE(error_of("Z===").find("'='"), std::string::npos) << error_of("Z===");
  EXPECT_NE(error_of("Zm9vY").find("truncated"), std::string::npos);
  EXPECT_NE(error_of("Zg=").find("padding"), std::string::npos) << error_of("Zg=");
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
  EXPECT_NE(error_of("data:image/png;base64,").find("empty"), std::string::npos);
  EXPECT_NE(error_of("data:image/png,rawdata").find("base64"), std::string::npos);
  EXPECT_NE(error_of("data:image/png;base64").find("','"), std::string::npos);
  EXPECT_NE(error_of(std::string("Zm9v\0YmFy", 9)).find("byte 0x0"), std::string::npos)
      << error_of(std::string("Zm9v\0YmFy", 9));
}

TEST(Base64, DecodesARealImagePayload) {
  // A 1x1 PNG, as a browser would put it in a data URI.
  const auto bytes = decode_base64_payload(
      "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQ"
      "DJ/pLvAAAAAElFTkSuQmCC");
  const Image image = decode_image(bytes);
  ASSERT_EQ(image.width, 1);
  ASSERT_EQ(image.height, 1);
  EXPECT_EQ(image.rgb, (std::vector<uint8_t>{255, 0, 0}));
}

}  // namespace
}  // namespace metrale::vision
