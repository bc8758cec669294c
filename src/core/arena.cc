#include "core/arena.h"

#include <sys/mman.h>

#include <cstdlib>

namespace metrale {

AlignedBuffer::AlignedBuffer(size_t bytes, bool huge_pages) {
  if (bytes == 0) return;
  const size_t align = huge_pages && bytes >= kHugePageBytes ? kHugePageBytes : kArenaAlignment;
  // Past the 47-bit user address space no allocation can succeed; saying so here also keeps
  // sanitizer allocators (which abort on absurd sizes) out of it.
  constexpr size_t kMaxBytes = size_t{1} << 47;
  METRALE_CHECK(bytes <= kMaxBytes, "AlignedBuffer: cannot allocate ", bytes,
                " bytes (more than the address space)");
  const size_t rounded = (bytes + align - 1) / align * align;  // aligned_alloc requires it
  data_ = std::aligned_alloc(align, rounded);
  METRALE_CHECK(data_ != nullptr, "AlignedBuffer: cannot allocate ", rounded, " bytes");
  size_ = bytes;
#ifdef MADV_HUGEPAGE
  // Advice only: without THP support (or with it disabled) the memory works the same.
  if (align == kHugePageBytes) (void)madvise(data_, rounded, MADV_HUGEPAGE);
#endif
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

}  // namespace metrale
