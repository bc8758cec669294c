#include "core/tensor.h"

#include <cstdint>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace metrale {
namespace {

std::string dims_str(std::span<const int64_t> dims) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims.size(); ++i) os << (i != 0 ? ", " : "") << dims[i];
  os << ']';
  return os.str();
}

}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  METRALE_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "shape ", dims_str(dims),
                " has rank ", dims.size(), "; at most ", kMaxDims, " dimensions are supported");
  for (size_t i = 0; i < dims.size(); ++i) {
    METRALE_CHECK(dims[i] >= 0, "shape ", dims_str(dims), ": dimension ", i,
                  " must be >= 0, found ", dims[i]);
    dims_[i] = dims[i];
  }
  rank_ = static_cast<int>(dims.size());
  (void)numel();  // a shape whose element count overflows int64 is rejected here, once
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) {
    const int64_t d = dims_[static_cast<size_t>(i)];
    METRALE_CHECK(d >= 0, "shape ", str(), ": dimension ", i, " must be >= 0, found ", d);
    METRALE_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / d, "shape ", str(),
                  " has more than 2^63 elements");
    n *= d;
  }
  return n;
}

std::string Shape::str() const { return dims_str(dims()); }

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if ((*this)[i] != o[i]) return false;
  }
  return true;
}

TensorView TensorView::contiguous(void* data, DType dtype, Shape shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = shape;
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    v.strides[static_cast<size_t>(i)] = stride;
    stride *= shape[i];
  }
  return v;
}

bool TensorView::is_contiguous() const {
  // As in torch: a dimension of size 1 may carry any stride, and an empty tensor is
  // contiguous whatever its strides.
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    const int64_t d = shape[i];
    if (d != 1 && strides[static_cast<size_t>(i)] != expected) return false;
    expected *= d;
  }
  return true;
}

std::string TensorView::str() const { return std::string(dtype_name(dtype)) + shape.str(); }

}  // namespace metrale
