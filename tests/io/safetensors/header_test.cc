// The header parser over in-memory bytes: what it accepts and how it rejects bad input.
#include "io/safetensors/header.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "test_util.h"

namespace metrale {
namespace {

using test::error_of;
using test::raw_file;

constexpr const char* kSource = "bad.safetensors";

std::string parse_error(const std::vector<std::byte>& bytes) {
  return error_of([&] { parse_safetensors_header(bytes, kSource); });
}
std::string parse_error(std::string_view header, size_t data_bytes) {
  return parse_error(raw_file(header, data_bytes));
}

// Every message names the file first, then carries the given words.
void expect_words(const std::string& message, std::initializer_list<const char*> words) {
  EXPECT_EQ(message.rfind(kSource, 0), 0u) << message;
  for (const char* w : words)
    EXPECT_NE(message.find(w), std::string::npos) << "'" << w << "' not in: " << message;
}

TEST(SafetensorsHeader, ParsesTensorsMetadataAndOffsets) {
  const std::string header = R"({"__metadata__":{"format":"pt","note":"x"},)"
                             R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[24,36]},)"
                             R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                             R"("s":{"dtype":"I64","shape":[],"data_offsets":[40,48]},)"
                             R"("z":{"dtype":"U8","shape":[0,5],"data_offsets":[36,36]}}  )";
  const auto bytes = raw_file(header, 48);
  const SafetensorsHeader h = parse_safetensors_header(bytes, "ok.safetensors");
  EXPECT_EQ(h.header_bytes, header.size());
  EXPECT_EQ(h.data_offset, 8 + header.size());
  EXPECT_EQ(h.data_bytes, 48u);
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "a");  // sorted by name
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[2].name, "s");
  EXPECT_EQ(h.tensors[3].name, "z");
  const auto* b = h.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(b->shape, Shape({2, 3}));
  EXPECT_EQ(b->begin, 24u);
  EXPECT_EQ(b->end, 36u);
  EXPECT_EQ(h.find("s")->shape.rank(), 0);
  EXPECT_EQ(h.find("s")->nbytes(), 8u);
  EXPECT_EQ(h.find("z")->nbytes(), 0u);
  EXPECT_EQ(h.find("missing"), nullptr);
  EXPECT_EQ(h.metadata.size(), 2u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  // The gap [36, 40) and no trailing data are accepted (see header.h).
}

TEST(SafetensorsHeader, AcceptsEmptyObjectAndSubByteTypes) {
  EXPECT_TRUE(parse_safetensors_header(raw_file("{}      ", 0), kSource).tensors.empty());
  const auto h = parse_safetensors_header(
      raw_file(R"({"q":{"dtype":"F4","shape":[3,4],"data_offsets":[0,6]}})", 6), kSource);
  EXPECT_EQ(h.tensors.at(0).dtype, DType::kE2M1);
  EXPECT_EQ(h.tensors.at(0).nbytes(), 6u);
}

TEST(SafetensorsHeader, EmptyFile) { expect_words(parse_error({}), {"0 bytes", "too short"}); }

TEST(SafetensorsHeader, TruncatedLengthField) {
  auto bytes = raw_file("{}", 0);
  bytes.resize(5);
  expect_words(parse_error(bytes), {"5 bytes", "truncated"});
}

TEST(SafetensorsHeader, ZeroLengthHeader) {
  expect_words(parse_error(raw_file("", 16)), {"header length is 0"});
}

TEST(SafetensorsHeader, HeaderLengthLargerThanFile) {
  expect_words(parse_error(raw_file("{}", 4, 1000)),
               {"header length 1000", "exceeds the 6 bytes", "truncated"});
}

TEST(SafetensorsHeader, HeaderLengthOverLimit) {
  expect_words(parse_error(raw_file("{}", 0, uint64_t{1} << 62)),
               {"exceeds the limit of 100000000"});
}

TEST(SafetensorsHeader, NotJson) {
  expect_words(parse_error("{\"a\": nope}", 0), {"header", "not valid JSON"});
  expect_words(parse_error("{\"a\":1} trailing", 0), {"not valid JSON"});
  expect_words(parse_error(std::string("{\"\xff\":1}"), 0), {"not valid JSON"});  // bad UTF-8
}

TEST(SafetensorsHeader, JsonNotAnObject) {
  expect_words(parse_error("[1, 2]", 0), {"must be a JSON object", "found array"});
  expect_words(parse_error("\"str\"", 0), {"must be a JSON object", "found string"});
}

TEST(SafetensorsHeader, EntryNotAnObject) {
  expect_words(parse_error(R"({"w": [1]})", 0),
               {"tensor 'w'", "expected an object", "found array"});
}

TEST(SafetensorsHeader, UnknownDtype) {
  expect_words(parse_error(R"({"w":{"dtype":"X99","shape":[1],"data_offsets":[0,1]}})", 1),
               {"tensor 'w'", "unknown dtype \"X99\"", "expected one of", "BF16", "F8_E4M3"});
  expect_words(parse_error(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1),
               {"tensor 'w'", "field 'dtype': expected a string", "found 7"});
}

TEST(SafetensorsHeader, WrongShapeType) {
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":"2,3","data_offsets":[0,6]}})", 6),
               {"tensor 'w'", "field 'shape': expected a list of integers", "found string"});
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2),
               {"tensor 'w'", "field 'shape': element 0: expected an integer", "found number 2.5"});
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[[2]],"data_offsets":[0,2]}})", 2),
               {"nesting deeper than 3", "'w'"});  // nested arrays never reach the tree
}

TEST(SafetensorsHeader, NegativeDim) {
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[2,-3],"data_offsets":[0,6]}})", 6),
               {"tensor 'w'", "field 'shape': element 1: expected an integer >= 0", "found -3"});
}

TEST(SafetensorsHeader, SizeMismatch) {
  expect_words(parse_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
               {"tensor 'w'", "[2, 3] x f32 = 24 bytes", "span 20 bytes"});
}

TEST(SafetensorsHeader, RangeOutsideFile) {
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 10),
               {"tensor 'w'", "[4, 12)", "outside the data section of 10 bytes"});
  // An offset too large for 64 bits arrives from JSON as a float, not an integer.
  expect_words(
      parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616]}})", 1),
      {"tensor 'w'", "field 'data_offsets': element 1: expected an integer", "found number"});
}

TEST(SafetensorsHeader, BeginAfterEnd) {
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 10),
               {"tensor 'w'", "begin 8 is after end 4"});
}

TEST(SafetensorsHeader, OverlappingRanges) {
  expect_words(parse_error(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                           12),
               {"'a' [0, 8)", "'b' [4, 12)", "overlap"});
  // A range nested inside another, listed first by name, is caught too.
  expect_words(parse_error(R"({"a_in":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},)"
                           R"("big":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})",
                           16),
               {"'big' [0, 16)", "'a_in' [8, 10)", "overlap"});
  // Same range twice.
  expect_words(parse_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
                           4),
               {"'a' [0, 4)", "'b' [0, 4)", "overlap"});
}

TEST(SafetensorsHeader, EmptyTensorsMayShareAnOffset) {
  const auto h = parse_safetensors_header(
      raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
               R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
               R"("e2":{"dtype":"F32","shape":[3,0],"data_offsets":[2,2]}})",
               4),
      kSource);
  EXPECT_EQ(h.tensors.size(), 3u);
}

TEST(SafetensorsHeader, HugeShapeOverflows) {
  expect_words(
      parse_error(
          R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0),
      {"tensor 'w'", "overflows"});
  // numel fits in 64 bits but numel x 32 bits does not.
  expect_words(
      parse_error(R"({"w":{"dtype":"F32","shape":[1152921504606846976],"data_offsets":[0,0]}})", 0),
      {"tensor 'w'", "overflows"});
  expect_words(
      parse_error(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0),
      {"tensor 'w'", "field 'shape': element 0: expected an integer that fits in int64",
       "9223372036854775808"});
}

TEST(SafetensorsHeader, SubByteCountMustFillBytes) {
  expect_words(parse_error(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
               {"tensor 'w'", "does not fill whole bytes"});
}

TEST(SafetensorsHeader, DuplicateNames) {
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                           R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                           2),
               {"duplicate key 'w'"});
  expect_words(
      parse_error(R"({"w":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1),
      {"duplicate key 'dtype' inside 'w'"});
}

TEST(SafetensorsHeader, ExtraOrMissingKeys) {
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}})", 1),
               {"tensor 'w'", "unexpected key 'extra'"});
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[1]}})", 1),
               {"tensor 'w'", "missing required field 'data_offsets'"});
  expect_words(parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
               {"tensor 'w'", "field 'data_offsets': expected [begin, end]", "[0]"});
}

TEST(SafetensorsHeader, BadMetadata) {
  expect_words(parse_error(R"({"__metadata__":{"k":1}})", 0),
               {"field '__metadata__.k': expected a string", "found 1"});
  expect_words(parse_error(R"({"__metadata__":[]})", 0),
               {"field '__metadata__': expected an object", "found array"});
}

TEST(SafetensorsHeader, RankAboveLimit) {
  expect_words(
      parse_error(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1),
      {"tensor 'w'", "rank 9", "at most 8"});
}

TEST(SafetensorsHeader, DeepNestingIsRejectedEarly) {
  const std::string deep =
      "{\"w\":{\"dtype\":" + std::string(100000, '[') + std::string(100000, ']') + "}}";
  expect_words(parse_error(deep, 0), {"nesting deeper than 3", "'w'"});
}

}  // namespace
}  // namespace metrale
