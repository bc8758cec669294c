#include "io/safetensors/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace metrale {

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.path_ = path.string();
  f.fd_ = ::open(f.path_.c_str(), O_RDONLY | O_CLOEXEC);
  METRALE_CHECK(f.fd_ >= 0, f.path_, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  METRALE_CHECK(::fstat(f.fd_, &st) == 0, f.path_, ": cannot stat: ", std::strerror(errno));
  METRALE_CHECK(S_ISREG(st.st_mode), f.path_, ": not a regular file");
  f.size_ = static_cast<uint64_t>(st.st_size);
  // mmap of 0 bytes fails with EINVAL; let the header parser explain the short file instead.
  if (f.size_ < 8) {
    std::byte buf[8];
    const ssize_t got = ::pread(f.fd_, buf, sizeof(buf), 0);
    parse_safetensors_header(
        std::span<const std::byte>(buf, got > 0 ? static_cast<size_t>(got) : 0), f.path_);
  }
  void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, f.fd_, 0);
  METRALE_CHECK(p != MAP_FAILED, f.path_, ": cannot mmap ", f.size_,
                " bytes: ", std::strerror(errno));
  f.base_ = static_cast<std::byte*>(p);
  f.header_ = parse_safetensors_header(std::span<const std::byte>(f.base_, f.size_), f.path_);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      header_(std::move(other.header_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    header_ = std::move(other.header_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() noexcept {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

const SafetensorsTensorInfo& SafetensorsFile::at(std::string_view name) const {
  const auto* t = find(name);
  METRALE_CHECK(t != nullptr, path_, ": no tensor named '", name, "' (the file holds ",
                header_.tensors.size(), " tensors)");
  return *t;
}

std::span<const std::byte> SafetensorsFile::bytes(const SafetensorsTensorInfo& t) const {
  // Offsets were validated against the data section when the header was parsed.
  return {base_ + header_.data_offset + t.begin, static_cast<size_t>(t.nbytes())};
}

TensorView SafetensorsFile::view(const SafetensorsTensorInfo& t) const {
  // TensorView has no const flavour; the mapping is PROT_READ, so a write faults loudly.
  auto* data = const_cast<std::byte*>(bytes(t).data());
  return TensorView::contiguous(data, t.dtype, t.shape);
}

bool SafetensorsFile::is_aligned(const SafetensorsTensorInfo& t) const {
  const int bits = dtype_bits(t.dtype);
  const uintptr_t align = bits >= 8 ? static_cast<uintptr_t>(bits / 8) : 1;
  return reinterpret_cast<uintptr_t>(bytes(t).data()) % align == 0;
}

}  // namespace metrale
