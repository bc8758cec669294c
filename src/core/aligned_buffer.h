#pragma once
// AlignedBuffer: the one owner of big, aligned host memory. Arena bumps through one, the CPU
// backend's allocate() hands them out as backend Buffers, and the bandwidth probes map theirs
// through it, so every such buffer gets the same alignment and huge-page treatment.
//
// Header-only, and needing nothing of metrale but core/error.h, so that
// bench/bandwidth_probe.cc, which bench/compare/run.py also compiles on its own with
// `c++ -I src`, shares it.
#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace metrale {

// Cache-line alignment: SIMD loads never straddle lines and no two threads' outputs share one.
inline constexpr size_t kCacheLineBytes = 64;
// From this size up, memory is mapped straight from the kernel in whole 2 MiB units so that
// transparent huge pages can back it: weight and workspace reads then miss the TLB far less
// (docs/performance.md: 4 KiB-page decode measured 2-4x slower).
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// What a mapping (>= kHugePageBytes) asks of transparent huge pages.
enum class PageAdvice {
  kHuge,     // starts on a 2 MiB boundary, advised MADV_HUGEPAGE (the default)
  kSmall,    // advised MADV_NOHUGEPAGE: 4 KiB pages whatever the system policy (probes)
  kDefault,  // no advice: the system's THP policy decides
};

// One aligned allocation, freed on destruction; move-only; contents start zeroed.
// Below kHugePageBytes it is heap memory aligned to kCacheLineBytes; from there up an
// anonymous mapping whose length is the size rounded up to 2 MiB, advised as asked.
// Failure throws metrale::Error naming the size.
class AlignedBuffer {
 public:
  using FreeFn = void (*)(void* data, size_t bytes);

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes, PageAdvice advice = PageAdvice::kHuge) {
    if (bytes == 0) return;
    // Past the 47-bit user address space nothing can succeed; saying so here also keeps
    // sanitizer allocators (which abort on absurd sizes) out of it.
    constexpr size_t kMaxBytes = size_t{1} << 47;
    METRALE_CHECK(bytes <= kMaxBytes, "AlignedBuffer: cannot allocate ", bytes,
                  " bytes (more than the address space)");
    if (bytes < kHugePageBytes) {
      const size_t rounded = round_up(bytes, kCacheLineBytes);  // aligned_alloc requires it
      data_ = std::aligned_alloc(kCacheLineBytes, rounded);
      METRALE_CHECK(data_ != nullptr, "AlignedBuffer: cannot allocate ", rounded, " bytes");
      std::memset(data_, 0, rounded);
      free_ = &free_heap;
    } else {
      data_ = map(bytes, advice);
      free_ = &unmap;
    }
    size_ = bytes;
  }
  ~AlignedBuffer() {
    if (data_ != nullptr) free_(data_, size_);
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        free_(std::exchange(o.free_, nullptr)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      AlignedBuffer dead(std::move(*this));
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      free_ = std::exchange(o.free_, nullptr);
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

  // Gives the memory to another owner, which frees it with free_fn(data, size): the triple
  // a backend Buffer (backend/buffer.h) is built from. Leaves this buffer empty.
  struct Released {
    void* data;
    size_t size;
    FreeFn free_fn;
  };
  Released release() {
    Released r{data_, size_, free_};
    data_ = nullptr;
    size_ = 0;
    free_ = nullptr;
    return r;
  }

 private:
  static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

  static void* map(size_t bytes, PageAdvice advice) {
    const size_t size = round_up(bytes, kHugePageBytes);
    // Over-map by one huge page to align the start to 2 MiB, then trim the slack.
    const size_t slack = advice == PageAdvice::kHuge ? kHugePageBytes : 0;
    void* raw =
        mmap(nullptr, size + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    METRALE_CHECK(raw != MAP_FAILED, "AlignedBuffer: cannot map ", size,
                  " bytes: ", std::strerror(errno));
    auto* base = static_cast<char*>(raw);
    char* start = base;
    if (slack > 0) {
      start = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(base), kHugePageBytes));
      const size_t head = static_cast<size_t>(start - base);
      if (head > 0) munmap(base, head);
      if (slack - head > 0) munmap(start + size, slack - head);
    }
    // Advice only: without THP support (or with it disabled) the memory works the same.
    if (advice == PageAdvice::kHuge) (void)madvise(start, size, MADV_HUGEPAGE);
    if (advice == PageAdvice::kSmall) (void)madvise(start, size, MADV_NOHUGEPAGE);
    return start;
  }
  static void free_heap(void* data, size_t /*bytes*/) { std::free(data); }
  static void unmap(void* data, size_t bytes) { munmap(data, round_up(bytes, kHugePageBytes)); }

  void* data_ = nullptr;
  size_t size_ = 0;
  FreeFn free_ = nullptr;
};

}  // namespace metrale
