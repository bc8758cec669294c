#pragma once
// Workspace: the per-pass scratch memory of the layers, carved from one buffer the engine
// allocated once for the largest pass (no allocation per step). A block takes what it needs
// at the start of its forward and hands the rest on; blocks that run one after the other
// reuse the same memory. workspace_floats() of a block states the most it takes, and take()
// checks it (a mismatch is a programming error, reported with the sizes).
#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/rows.h"
#include "core/error.h"

namespace metrale {

// Row strides are padded to 16 floats, so every row starts 64-byte aligned.
inline int64_t padded_cols(int64_t n_cols) { return (n_cols + 15) / 16 * 16; }
// Floats that Workspace::rows(n_rows, n_cols) takes.
inline size_t rows_floats(int64_t n_rows, int64_t n_cols) {
  return static_cast<size_t>(n_rows * padded_cols(n_cols));
}
// Floats that Workspace::ints(n) / floats(n) take.
inline size_t span_floats(size_t n) { return (n + 15) / 16 * 16; }

class Workspace {
 public:
  Workspace() = default;
  Workspace(float* base, size_t n_floats) : p_(base), left_(n_floats) {}

  Rows rows(int64_t n_rows, int64_t n_cols) {
    const int64_t stride = padded_cols(n_cols);
    return {take(rows_floats(n_rows, n_cols)), n_rows, n_cols, stride};
  }
  std::span<float> floats(size_t n) { return {take(span_floats(n)), n}; }
  std::span<int32_t> ints(size_t n) {
    static_assert(sizeof(int32_t) == sizeof(float));
    return {reinterpret_cast<int32_t*>(take(span_floats(n))), n};
  }
  size_t left() const { return left_; }

 private:
  float* take(size_t n) {
    METRALE_CHECK(n <= left_, "workspace: a block takes ", n, " floats, ", left_,
                  " are left (its workspace_floats() under-counts)");
    float* p = p_;
    p_ += n;
    left_ -= n;
    return p;
  }
  float* p_ = nullptr;
  size_t left_ = 0;
};

}  // namespace metrale
