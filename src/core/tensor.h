#pragma once
// TensorView: a non-owning view of strided memory. Strides count elements, not bytes
// (for packed 4-bit types a stride counts elements too; such views must be contiguous in
// their last dimension).
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/dtype.h"

namespace metrale {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  std::string str() const;  // "[2, 3]"
  bool operator==(const Shape& o) const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  std::array<int64_t, kMaxDims> strides{};  // in elements

  // A contiguous (row-major) view.
  static TensorView contiguous(void* data, DType dtype, Shape shape);

  int rank() const { return shape.rank(); }
  int64_t numel() const { return shape.numel(); }
  bool is_contiguous() const;
  size_t nbytes() const { return dtype_bytes(dtype, static_cast<size_t>(numel())); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  std::string str() const;  // "bf16[2, 3]"
};

}  // namespace metrale
