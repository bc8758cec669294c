#pragma once
// Helpers shared by the CPU backend tests: seeded random data, deliberately misaligned
// buffers, and running a check once per compiled SIMD target.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "hwy/targets.h"

namespace metrale::testing {

// Runs fn() once per Highway target this binary was built with and the CPU supports,
// with dynamic dispatch forced to that target.
template <class Fn>
void for_each_target(Fn&& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A float array whose first element sits `offset` floats past a 64-byte boundary, so
// kernels see pointers that are not vector-aligned.
class Floats {
 public:
  Floats(size_t n, size_t offset) : storage_(n + offset + 16) {
    const auto addr = reinterpret_cast<uintptr_t>(storage_.data());
    offset_ = ((64 - addr % 64) % 64) / sizeof(float) + offset;
  }
  float* data() { return storage_.data() + offset_; }
  float& operator[](size_t i) { return data()[i]; }

 private:
  std::vector<float> storage_;
  size_t offset_ = 0;
};

inline void fill_uniform(float* p, size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < n; ++i) p[i] = dist(rng);
}

inline std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::vector<float> v(n);
  fill_uniform(v.data(), n, seed, lo, hi);
  return v;
}

// A random [n_out, n_in] matrix rounded to bf16 (round to nearest even).
inline std::vector<uint16_t> random_bf16_matrix(int64_t n_out, int64_t n_in, uint32_t seed) {
  const auto v = random_vector(static_cast<size_t>(n_out * n_in), seed);
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

inline uint32_t as_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

}  // namespace metrale::testing
