#pragma once
// One .safetensors file, memory-mapped read-only (MAP_PRIVATE, PROT_READ): tensors are
// zero-copy views into the mapping. Views stay valid while the SafetensorsFile lives (moving
// it keeps them valid too; the mapping does not move). The memory is read-only: writing
// through a view's `data` faults. Truncating the file on disk while it is mapped makes the
// kernel raise SIGBUS on access; that is outside what a reader can defend against.
//
// Alignment: the data section starts 8-byte aligned in files the Python package writes (it
// pads the header to 8 bytes and orders tensors by descending alignment), but the format
// does not promise it, so check `is_aligned()` before reading a view as a wider type.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "core/tensor.h"
#include "io/safetensors/header.h"

namespace metrale {

// How SafetensorsFile::copy_to streams bytes out of the mapping.
struct CopyOptions {
  // Bytes per step: read-ahead for the next chunk is requested (MADV_WILLNEED) while this
  // one is copied, and this one's pages are released (MADV_DONTNEED) right after.
  size_t chunk_bytes = size_t{32} << 20;
  // Also ask the kernel to drop the copied range from the page cache (POSIX_FADV_DONTNEED),
  // for loads whose destination is the only copy that should stay in RAM.
  bool drop_page_cache = false;
};

class SafetensorsFile {
 public:
  // Opens, maps and validates `path`. Throws metrale::Error naming the path.
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  // All tensors, sorted by name.
  std::span<const SafetensorsTensorInfo> tensors() const { return header_.tensors; }
  // nullptr when absent.
  const SafetensorsTensorInfo* find(std::string_view name) const { return header_.find(name); }
  // Throws an Error naming the file and the tensor when absent.
  const SafetensorsTensorInfo& at(std::string_view name) const;

  // The tensor's bytes inside the mapping.
  std::span<const std::byte> bytes(const SafetensorsTensorInfo& t) const;
  // A contiguous view over the mapping (read-only memory, see above).
  TensorView view(const SafetensorsTensorInfo& t) const;
  // Whether the tensor's first byte is aligned to its element size (1 for sub-byte types).
  bool is_aligned(const SafetensorsTensorInfo& t) const;

  // Copies the tensor's bytes into `dst` (exactly nbytes() long) chunk by chunk, releasing
  // each chunk of the mapping once copied, so loading into anonymous memory never keeps
  // both the mapped and the copied pages resident in this process. Views handed out earlier
  // stay valid: released pages of a private read-only mapping fault back in from the file.
  void copy_to(const SafetensorsTensorInfo& t, std::span<std::byte> dst,
               const CopyOptions& options = {}) const;

 private:
  SafetensorsFile() = default;
  void release() noexcept;

  std::string path_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
};

}  // namespace metrale
