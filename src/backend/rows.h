#pragma once
// Rows: the activation view every backend op takes. Activations are f32, a batch of rows
// (tokens), each `n_cols` values, `stride` values apart; a stride larger than n_cols lets an
// op read a slice of a wider row (q, k and v inside one fused qkv output) without a copy.
#include <cstdint>

namespace metrale {

struct ConstRows {
  const float* data = nullptr;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  int64_t stride = 0;  // in floats, >= n_cols

  const float* row(int64_t r) const { return data + r * stride; }
};

struct Rows {
  float* data = nullptr;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  int64_t stride = 0;  // in floats, >= n_cols

  float* row(int64_t r) const { return data + r * stride; }
  operator ConstRows() const {
    return {data, n_rows, n_cols, stride};
  }  // NOLINT: implicit on purpose
};

// Contiguous rows: stride == n_cols.
inline Rows rows_of(float* data, int64_t n_rows, int64_t n_cols) {
  return {data, n_rows, n_cols, n_cols};
}
inline ConstRows rows_of(const float* data, int64_t n_rows, int64_t n_cols) {
  return {data, n_rows, n_cols, n_cols};
}
// Columns [col, col + n_cols) of every row of `r` (e.g. the k part of a fused qkv output).
inline Rows column_slice(Rows r, int64_t col, int64_t n_cols) {
  return {r.data + col, r.n_rows, n_cols, r.stride};
}
inline ConstRows column_slice(ConstRows r, int64_t col, int64_t n_cols) {
  return {r.data + col, r.n_rows, n_cols, r.stride};
}

}  // namespace metrale
