#include "core/arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

namespace metrale {
namespace {

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

TEST(AlignedBuffer, SmallIsCacheLineAligned) {
  AlignedBuffer b(100);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.size(), 100u);
  EXPECT_TRUE(aligned(b.data(), kArenaAlignment));
  std::memset(b.data(), 0x5A, b.size());  // the whole requested size is writable
  EXPECT_EQ(b.as<unsigned char>()[99], 0x5A);
}

TEST(AlignedBuffer, LargeIsHugePageAligned) {
  AlignedBuffer b(kHugePageBytes + 123);
  EXPECT_TRUE(aligned(b.data(), kHugePageBytes));
  std::memset(b.data(), 1, b.size());
  AlignedBuffer plain(kHugePageBytes, /*huge_pages=*/false);
  EXPECT_TRUE(aligned(plain.data(), kArenaAlignment));
}

TEST(AlignedBuffer, EmptyAndMove) {
  AlignedBuffer empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);
  AlignedBuffer zero(0);
  EXPECT_EQ(zero.data(), nullptr);

  AlignedBuffer a(256);
  void* p = a.data();
  AlignedBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  AlignedBuffer c(64);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 256u);
}

TEST(AlignedBuffer, ImpossibleSizeIsAnError) {
  EXPECT_THROW(AlignedBuffer(std::numeric_limits<size_t>::max() - 10), Error);
  EXPECT_THROW(AlignedBuffer(std::numeric_limits<size_t>::max() / 2), Error);
}

TEST(Arena, BumpsAlignedBlocks) {
  Arena arena(4096);
  EXPECT_EQ(arena.capacity(), 4096u);
  auto* a = static_cast<unsigned char*>(arena.alloc(1));
  auto* b = static_cast<unsigned char*>(arena.alloc(65));
  float* c = arena.alloc_array<float>(10);
  EXPECT_TRUE(aligned(a, 64));
  EXPECT_TRUE(aligned(b, 64));
  EXPECT_TRUE(aligned(c, 64));
  EXPECT_EQ(b - a, 64);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(c) - b, 128);
  EXPECT_EQ(arena.used(), 64u + 128u + 64u);
}

TEST(Arena, ResetReusesTheSameMemory) {
  Arena arena(1024);
  void* first = arena.alloc(100);
  arena.alloc(500);
  const size_t peak = arena.used();
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.alloc(100), first);
  EXPECT_EQ(arena.high_water(), peak);
}

TEST(Arena, OverflowIsAnError) {
  Arena arena(256);
  arena.alloc(190);  // padded to 192
  EXPECT_THROW(arena.alloc(100), Error);
  EXPECT_NO_THROW(arena.alloc(64));  // exactly fills the rest
  EXPECT_EQ(arena.used(), 256u);
  EXPECT_THROW(arena.alloc(1), Error);
  EXPECT_THROW(arena.alloc_array<double>(std::numeric_limits<size_t>::max() / 4), Error);
  Arena none;
  EXPECT_THROW(none.alloc(1), Error);
}

}  // namespace
}  // namespace metrale
