#include "core/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

namespace metrale {
namespace {

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

bool all_zero(const AlignedBuffer& b) {
  const auto* p = b.as<const unsigned char>();
  for (size_t i = 0; i < b.size(); i += 97) {
    if (p[i] != 0) return false;
  }
  return p[b.size() - 1] == 0;
}

TEST(AlignedBuffer, SmallIsCacheLineAlignedAndZeroed) {
  AlignedBuffer b(100);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.size(), 100u);
  EXPECT_TRUE(aligned(b.data(), kCacheLineBytes));
  EXPECT_TRUE(all_zero(b));
  std::memset(b.data(), 0x5A, b.size());  // the whole requested size is writable
  EXPECT_EQ(b.as<unsigned char>()[99], 0x5A);
}

TEST(AlignedBuffer, LargeIsAMappingAlignedAsAdvised) {
  for (PageAdvice advice : {PageAdvice::kHuge, PageAdvice::kSmall, PageAdvice::kDefault}) {
    AlignedBuffer b(kHugePageBytes + 123, advice);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), kHugePageBytes + 123);
    EXPECT_TRUE(aligned(b.data(), advice == PageAdvice::kHuge ? kHugePageBytes : 4096));
    EXPECT_TRUE(all_zero(b));
    std::memset(b.data(), 1, b.size());
  }
}

TEST(AlignedBuffer, EmptyAndMove) {
  AlignedBuffer empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);
  AlignedBuffer zero(0);
  EXPECT_EQ(zero.data(), nullptr);

  for (size_t bytes : {size_t{256}, kHugePageBytes * 3}) {
    AlignedBuffer a(bytes);
    void* p = a.data();
    AlignedBuffer b(std::move(a));
    EXPECT_EQ(b.data(), p);
    EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
    AlignedBuffer c(64);
    c = std::move(b);  // frees c's own block
    EXPECT_EQ(c.data(), p);
    EXPECT_EQ(c.size(), bytes);
  }
}

// release() hands over exactly what a backend Buffer needs to free the memory later.
TEST(AlignedBuffer, ReleaseHandsOverTheFreeFunction) {
  for (size_t bytes : {size_t{1}, kHugePageBytes, kHugePageBytes * 2 + 1}) {
    AlignedBuffer b(bytes);
    void* p = b.data();
    const AlignedBuffer::Released r = b.release();
    EXPECT_EQ(r.data, p);
    EXPECT_EQ(r.size, bytes);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(b.data(), nullptr);
    ASSERT_NE(r.free_fn, nullptr);
    static_cast<unsigned char*>(r.data)[bytes - 1] = 7;
    r.free_fn(r.data, r.size);
  }
}

TEST(AlignedBuffer, ImpossibleSizeIsAnError) {
  EXPECT_THROW(AlignedBuffer(std::numeric_limits<size_t>::max() - 10), Error);
  EXPECT_THROW(AlignedBuffer(std::numeric_limits<size_t>::max() / 2), Error);
}

}  // namespace
}  // namespace metrale
