// SafetensorsFile: mmap, zero-copy views, moves, and streaming copies.
#include "io/safetensors/file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "io/safetensors/writer.h"
#include "test_util.h"

namespace metrale {
namespace {

using test::error_of;
using test::ScratchDir;

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(seed)) & 0xff);
  return v;
}

TEST(SafetensorsFile, ViewsPointIntoTheMapping) {
  ScratchDir dir;
  const auto a = pattern(2 * 3 * 4, 1);
  const auto b = pattern(5 * 2, 2);
  SafetensorsWriter w;
  w.add("a", DType::kF32, Shape{2, 3}, a);
  w.add("b", DType::kBF16, Shape{5}, b);
  w.set_metadata("format", "pt");
  w.write(dir / "m.safetensors");

  const SafetensorsFile f = SafetensorsFile::open(dir / "m.safetensors");
  EXPECT_EQ(f.path(), (dir / "m.safetensors").string());
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto& ta = f.at("a");
  const TensorView va = f.view(ta);
  EXPECT_EQ(va.dtype, DType::kF32);
  EXPECT_EQ(va.shape, Shape({2, 3}));
  EXPECT_TRUE(f.is_aligned(ta));
  EXPECT_EQ(std::memcmp(va.data, a.data(), a.size()), 0);
  EXPECT_EQ(va.data, static_cast<const void*>(f.bytes(ta).data()));
  const auto bb = f.bytes(f.at("b"));
  ASSERT_EQ(bb.size(), b.size());
  EXPECT_TRUE(std::equal(bb.begin(), bb.end(), b.begin()));
  // Zero-copy: the view lies inside the file's mapping, at data_offset + begin.
  EXPECT_EQ(static_cast<const std::byte*>(va.data) - f.header().data_offset - ta.begin,
            f.bytes(f.at("b")).data() - f.header().data_offset - f.at("b").begin);
}

TEST(SafetensorsFile, MoveKeepsViewsValid) {
  ScratchDir dir;
  const auto a = pattern(64, 3);
  SafetensorsWriter w;
  w.add("a", DType::kU8, Shape{64}, a);
  w.write(dir / "m.safetensors");
  SafetensorsFile f = SafetensorsFile::open(dir / "m.safetensors");
  const void* before = f.view(f.at("a")).data;
  SafetensorsFile g = std::move(f);
  EXPECT_EQ(g.view(g.at("a")).data, before);
  SafetensorsFile h = SafetensorsFile::open(dir / "m.safetensors");
  h = std::move(g);  // the old mapping of h is released, g's moves over
  EXPECT_EQ(h.view(h.at("a")).data, before);
  EXPECT_EQ(std::memcmp(before, a.data(), a.size()), 0);
}

TEST(SafetensorsFile, MissingTensorNamesFileAndTensor) {
  ScratchDir dir;
  SafetensorsWriter w;
  w.add("a", DType::kU8, Shape{1}, pattern(1, 0));
  w.write(dir / "m.safetensors");
  const auto f = SafetensorsFile::open(dir / "m.safetensors");
  EXPECT_EQ(f.find("nope"), nullptr);
  const std::string msg = error_of([&] { f.at("nope"); });
  EXPECT_NE(msg.find("m.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no tensor named 'nope'"), std::string::npos) << msg;
}

TEST(SafetensorsFile, OpenErrorsNameThePath) {
  ScratchDir dir;
  std::string msg = error_of([&] { SafetensorsFile::open(dir / "absent.safetensors"); });
  EXPECT_NE(msg.find("absent.safetensors: cannot open"), std::string::npos) << msg;
  msg = error_of([&] { SafetensorsFile::open(dir.path()); });
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;

  test::write_bytes(dir / "empty.safetensors", {});
  msg = error_of([&] { SafetensorsFile::open(dir / "empty.safetensors"); });
  EXPECT_NE(msg.find("empty.safetensors: file is 0 bytes"), std::string::npos) << msg;

  test::write_bytes(dir / "short.safetensors", std::vector<std::byte>(3, std::byte{1}));
  msg = error_of([&] { SafetensorsFile::open(dir / "short.safetensors"); });
  EXPECT_NE(msg.find("short.safetensors: file is 3 bytes"), std::string::npos) << msg;

  // A file cut short in its data section: the header promises more than is there.
  SafetensorsWriter w;
  w.add("a", DType::kF32, Shape{16}, pattern(64, 0));
  auto bytes = w.serialize();
  bytes.resize(bytes.size() - 10);
  test::write_bytes(dir / "cut.safetensors", bytes);
  msg = error_of([&] { SafetensorsFile::open(dir / "cut.safetensors"); });
  EXPECT_NE(msg.find("cut.safetensors: tensor 'a'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("outside the data section of 54 bytes"), std::string::npos) << msg;
}

TEST(SafetensorsFile, CopyToStreamsInChunksAndViewsSurvive) {
  ScratchDir dir;
  // Several pages, odd-sized, behind an odd-sized neighbour so chunks start mid-page.
  const auto small = pattern(13, 5);
  const auto big = pattern(3 * (4096 + 3) * 4, 9);
  SafetensorsWriter w;
  w.add("big", DType::kF32, Shape{3, 4096 + 3}, big);
  w.add("small", DType::kU8, Shape{13}, small);
  w.write(dir / "m.safetensors");
  const auto f = SafetensorsFile::open(dir / "m.safetensors");

  for (size_t chunk : {size_t{1}, size_t{4096}, size_t{5000}, size_t{1} << 20}) {
    std::vector<std::byte> dst(big.size());
    f.copy_to(f.at("big"), dst, {.chunk_bytes = chunk, .drop_page_cache = chunk == 4096});
    EXPECT_EQ(dst, big) << "chunk " << chunk;
    // The released pages fault back in from the file: views still read the right bytes.
    const auto again = f.bytes(f.at("big"));
    EXPECT_TRUE(std::equal(again.begin(), again.end(), big.begin())) << "chunk " << chunk;
  }
  std::vector<std::byte> dst(small.size());
  f.copy_to(f.at("small"), dst);
  EXPECT_EQ(dst, small);

  std::vector<std::byte> wrong(12);
  const std::string msg = error_of([&] { f.copy_to(f.at("small"), wrong); });
  EXPECT_NE(msg.find("tensor 'small' is 13 bytes, but the destination holds 12"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace metrale
