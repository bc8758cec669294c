// SafetensorsWriter: round trips through the parser and the writer's own checks.
#include "io/safetensors/writer.h"

#include <gtest/gtest.h>

#include "io/safetensors/file.h"
#include "io/safetensors/header.h"
#include "test_util.h"

namespace metrale {
namespace {

using test::error_of;

struct Case {
  std::string name;
  DType dtype;
  Shape shape;
};

std::vector<std::byte> fill(size_t n, size_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 29 + seed * 7 + 1) & 0xff);
  return v;
}

TEST(SafetensorsWriter, RoundTripsEveryDtype) {
  const std::vector<Case> cases = {
      {"f64", DType::kF64, {3}},        {"f32", DType::kF32, {2, 3}},
      {"f16", DType::kF16, {5}},        {"bf16", DType::kBF16, {1, 1, 3}},
      {"i64", DType::kI64, {2}},        {"i32", DType::kI32, {3}},
      {"i16", DType::kI16, {7}},        {"i8", DType::kI8, {3}},
      {"u8", DType::kU8, {4, 1}},       {"bool", DType::kBool, {2}},
      {"e4m3", DType::kF8E4M3, {3, 3}}, {"e5m2", DType::kF8E5M2, {1}},
      {"e8m0", DType::kE8M0, {5}},      {"fp4", DType::kE2M1, {2, 6}},
      {"scalar", DType::kF32, {}},      {"empty", DType::kBF16, {0, 4}},
  };
  SafetensorsWriter w;
  std::vector<std::vector<std::byte>> data;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto n = safetensors_nbytes(cases[i].dtype, cases[i].shape.dims());
    ASSERT_TRUE(n.has_value());
    data.push_back(fill(*n, i));
    w.add(cases[i].name, cases[i].dtype, cases[i].shape, data.back());
  }
  w.set_metadata("format", "pt");
  w.set_metadata("quote\"d", "line\nbreak");
  const auto bytes = w.serialize();

  const SafetensorsHeader h = parse_safetensors_header(bytes, "roundtrip");
  EXPECT_EQ(h.header_bytes % 8, 0u);  // padded like the Python package
  EXPECT_EQ(h.data_bytes, bytes.size() - h.data_offset);
  EXPECT_EQ(h.metadata.at("quote\"d"), "line\nbreak");
  ASSERT_EQ(h.tensors.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto* t = h.find(cases[i].name);
    ASSERT_NE(t, nullptr) << cases[i].name;
    EXPECT_EQ(t->dtype, cases[i].dtype) << cases[i].name;
    EXPECT_EQ(t->shape, cases[i].shape) << cases[i].name;
    ASSERT_EQ(t->nbytes(), data[i].size()) << cases[i].name;
    EXPECT_TRUE(std::equal(data[i].begin(), data[i].end(),
                           bytes.begin() + static_cast<ptrdiff_t>(h.data_offset + t->begin)))
        << cases[i].name;
    // Descending alignment order puts every tensor on a multiple of its element size.
    const int bits = dtype_bits(t->dtype);
    if (bits >= 8) {
      EXPECT_EQ((h.data_offset + t->begin) % static_cast<uint64_t>(bits / 8), 0u) << cases[i].name;
    }
  }
}

TEST(SafetensorsWriter, WriteThenOpen) {
  test::ScratchDir dir;
  SafetensorsWriter w;
  const auto a = fill(8, 1);
  w.add("a", DType::kI16, Shape{4}, a);
  w.write(dir / "x.safetensors");
  EXPECT_EQ(test::read_bytes(dir / "x.safetensors"), w.serialize());
  const auto f = SafetensorsFile::open(dir / "x.safetensors");
  EXPECT_EQ(f.at("a").shape, Shape({4}));

  const std::string msg = error_of([&] { w.write(dir / "no_such_dir" / "x.safetensors"); });
  EXPECT_NE(msg.find("cannot open for writing"), std::string::npos) << msg;
}

TEST(SafetensorsWriter, EmptyFileMatchesThePackage) {
  // The package writes "{}" padded to 8 bytes for no tensors and no metadata.
  const auto bytes = SafetensorsWriter().serialize();
  ASSERT_EQ(bytes.size(), 16u);
  EXPECT_EQ(std::to_integer<int>(bytes[0]), 8);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()) + 8, 8), "{}      ");
}

TEST(SafetensorsWriter, RejectsBadTensors) {
  SafetensorsWriter w;
  w.add("a", DType::kU8, Shape{2}, fill(2, 0));
  std::string msg = error_of([&] { w.add("a", DType::kU8, Shape{2}, fill(2, 0)); });
  EXPECT_NE(msg.find("tensor 'a' added twice"), std::string::npos) << msg;
  msg = error_of([&] { w.add("b", DType::kF32, Shape{2, 2}, fill(15, 0)); });
  EXPECT_NE(msg.find("tensor 'b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("= 16 bytes, but 15 bytes were given"), std::string::npos) << msg;
  msg = error_of([&] { w.add("__metadata__", DType::kU8, Shape{1}, fill(1, 0)); });
  EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  msg = error_of([&] { w.add("odd", DType::kE2M1, Shape{3}, fill(2, 0)); });
  EXPECT_NE(msg.find("does not fill whole bytes"), std::string::npos) << msg;
}

}  // namespace
}  // namespace metrale
