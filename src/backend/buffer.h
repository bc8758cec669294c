#pragma once
// Buffer: memory a backend allocated (host memory for the CPU backend, device memory for a
// GPU one). Move-only; frees itself through the function its backend gave it. Its device tag
// says whether host code may touch the bytes directly (kHost) or only through the backend's
// upload / download / copy (any other device).
#include <cstddef>
#include <cstdint>
#include <utility>

namespace metrale {

enum class Device : uint8_t {
  kHost,  // the CPU's memory: host code reads and writes it directly
  kCuda,  // a CUDA device's memory: reached only through Backend's memory ops
};

class Buffer {
 public:
  using FreeFn = void (*)(void* data, size_t bytes);

  Buffer() = default;
  Buffer(void* data, size_t bytes, FreeFn free_fn, Device device = Device::kHost)
      : data_(data), bytes_(bytes), free_(free_fn), device_(device) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~Buffer() {
    if (data_ != nullptr && free_ != nullptr) free_(data_, bytes_);
  }

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  Device device() const { return device_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(free_, o.free_);
    std::swap(device_, o.device_);
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  FreeFn free_ = nullptr;
  Device device_ = Device::kHost;
};

}  // namespace metrale
