#pragma once
// Arena: a bump allocator over one AlignedBuffer (core/aligned_buffer.h), so a decode step
// allocates nothing (reserve once at load, reset per step).
#include <cstddef>
#include <cstdint>

#include "core/aligned_buffer.h"
#include "core/error.h"

namespace metrale {

// Every block starts on a cache line.
inline constexpr size_t kArenaAlignment = kCacheLineBytes;

// A bump allocator over one AlignedBuffer: every block starts 64-byte aligned; reset()
// frees everything at once. Not thread-safe: one arena per thread or per planned workspace.
class Arena {
 public:
  Arena() = default;
  explicit Arena(size_t capacity, PageAdvice advice = PageAdvice::kHuge)
      : buffer_(capacity, advice) {}

  // A 64-byte-aligned block of `bytes`; throws metrale::Error when the arena is too small
  // (the capacity was planned wrong, so fail loudly rather than fall back to malloc).
  void* alloc(size_t bytes) {
    const size_t cap = buffer_.size();
    METRALE_CHECK(bytes <= cap - used_, "arena: allocating ", bytes, " bytes with ", used_, " of ",
                  cap, " used");
    void* p = static_cast<unsigned char*>(buffer_.data()) + used_;
    const size_t rest = cap - used_ - bytes;
    const size_t pad = (kArenaAlignment - bytes % kArenaAlignment) % kArenaAlignment;
    used_ += bytes + (pad < rest ? pad : rest);
    if (used_ > high_water_) high_water_ = used_;
    return p;
  }

  template <typename T>
  T* alloc_array(size_t n) {
    METRALE_CHECK(n <= SIZE_MAX / sizeof(T), "arena: ", n, " elements of ", sizeof(T),
                  " bytes overflow size_t");
    return static_cast<T*>(alloc(n * sizeof(T)));
  }

  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return buffer_.size(); }
  size_t high_water() const { return high_water_; }  // most ever used, across resets

 private:
  AlignedBuffer buffer_;
  size_t used_ = 0;
  size_t high_water_ = 0;
};

}  // namespace metrale
