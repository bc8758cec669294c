#pragma once
// Memory for compute: AlignedBuffer owns one aligned allocation; Arena bumps through one
// such buffer so a decode step allocates nothing (reserve once at load, reset per step).
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/error.h"

namespace metrale {

// Cache-line alignment: SIMD loads never straddle lines and no two threads' outputs share one.
inline constexpr size_t kArenaAlignment = 64;
// At this size and above AlignedBuffer aligns to a 2 MiB boundary and asks for transparent
// huge pages: weight and workspace reads then miss the TLB far less (DESIGN.md measured
// 4 KiB-page decode 2-4x slower).
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// One aligned heap allocation, freed on destruction; move-only. Contents start
// uninitialised. Allocation failure throws metrale::Error naming the size.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes, bool huge_pages = true);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      AlignedBuffer dead(std::move(*this));
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }  // as requested (the allocation may be rounded up)
  bool empty() const { return size_ == 0; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// A bump allocator over one AlignedBuffer: every block starts 64-byte aligned; reset()
// frees everything at once. Not thread-safe: one arena per thread or per planned workspace.
class Arena {
 public:
  Arena() = default;
  explicit Arena(size_t capacity, bool huge_pages = true) : buffer_(capacity, huge_pages) {}

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
