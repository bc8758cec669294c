#include "core/arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace metrale {
namespace {

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

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
