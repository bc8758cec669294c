// SafetensorsFile::copy_to: streaming a tensor out of the mapping into caller-owned memory.
//
// Why chunks and madvise: copying a multi-GB tensor with one memcpy faults the whole source
// range into this process and keeps it there, so for a moment the weights are resident
// twice (mapped file pages + the anonymous destination). Walking the range in chunks, asking
// for the next chunk ahead of time (MADV_WILLNEED, on top of MADV_SEQUENTIAL for the range)
// and dropping each chunk from our mapping right after it is copied (MADV_DONTNEED) keeps the
// mapped part down to about two chunks. MADV_DONTNEED on a private mapping we never wrote
// only unmaps clean file pages: nothing is lost, a later read faults them back in. The page
// cache may still hold them as reclaimable cache; CopyOptions::drop_page_cache asks the
// kernel to drop that too.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "io/safetensors/file.h"

namespace metrale {

namespace {

size_t page_size() {
  static const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return kPage;
}

// madvise wants a page-aligned start; widening to whole pages is harmless for advice on a
// read-only private mapping (neighbouring bytes simply fault back in if used).
void advise(std::byte* map_base, uint64_t map_size, uint64_t off, uint64_t len, int advice) {
  if (len == 0) return;
  const uint64_t page = page_size();
  const uint64_t start = off / page * page;
  const uint64_t stop = std::min<uint64_t>(map_size, off + len);
  ::madvise(map_base + start, static_cast<size_t>(stop - start), advice);  // advisory only
}

}  // namespace

void SafetensorsFile::copy_to(const SafetensorsTensorInfo& t, std::span<std::byte> dst,
                              const CopyOptions& options) const {
  METRALE_CHECK(dst.size() == t.nbytes(), path_, ": tensor '", t.name, "' is ", t.nbytes(),
                " bytes, but the destination holds ", dst.size());
  const uint64_t begin = header_.data_offset + t.begin;  // offset in the file and the mapping
  const uint64_t total = t.nbytes();
  const uint64_t chunk = std::max<uint64_t>(options.chunk_bytes, page_size());

  advise(base_, size_, begin, total, MADV_SEQUENTIAL);
  advise(base_, size_, begin, std::min(chunk, total), MADV_WILLNEED);
  for (uint64_t done = 0; done < total;) {
    const uint64_t len = std::min(chunk, total - done);
    if (done + len < total) {
      advise(base_, size_, begin + done + len, std::min(chunk, total - done - len), MADV_WILLNEED);
    }
    std::memcpy(dst.data() + done, base_ + begin + done, static_cast<size_t>(len));
    advise(base_, size_, begin + done, len, MADV_DONTNEED);
    if (options.drop_page_cache) {
      ::posix_fadvise(fd_, static_cast<off_t>(begin + done), static_cast<off_t>(len),
                      POSIX_FADV_DONTNEED);
    }
    done += len;
  }
}

}  // namespace metrale
