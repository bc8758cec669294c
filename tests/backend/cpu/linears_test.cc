// Backend::linears: a batch of products with their own weights, inputs (column slices of one
// row block, as MLA's per-head absorption reads them) and outputs equals each product run by
// linear() alone, bit for bit, for f32 and bf16 weights under f32 and bf16 compute, any row
// count and thread count; bad calls are refused naming the weight.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::random_bf16_matrix;
using testing::random_vector;

// `heads` products of [n_out, n_in] weights (even heads bf16, odd heads f32) over column
// slices of one [rows, heads * (n_in + 3)] input.
struct Heads {
  int64_t heads, n_in, n_out;
  std::vector<std::vector<uint16_t>> w16;
  std::vector<std::vector<float>> w32;
  std::vector<WeightTensor> w;

  Heads(Backend& be, int64_t heads_, int64_t n_in_, int64_t n_out_)
      : heads(heads_), n_in(n_in_), n_out(n_out_) {
    for (int64_t h = 0; h < heads; ++h) {
      const auto seed = static_cast<uint32_t>(100 + h);
      w16.push_back(random_bf16_matrix(n_out, n_in, seed));
      w32.push_back(random_vector(static_cast<size_t>(n_out * n_in), seed));
      WeightTensor t{.name = "head " + std::to_string(h),
                     .format = h % 2 == 0 ? WeightFormat::kBF16 : WeightFormat::kF32,
                     .n_out = n_out,
                     .n_in = n_in,
                     .data = h % 2 == 0 ? static_cast<const void*>(w16.back().data())
                                        : static_cast<const void*>(w32.back().data())};
      w.push_back(be.prepare(t, PrepareMode::kCopy));
    }
  }
  int64_t in_width() const { return heads * (n_in + 3); }
  ConstRows x_of(const std::vector<float>& x, int64_t rows, int64_t h) const {
    return column_slice(rows_of(x.data(), rows, in_width()), h * (n_in + 3) + 1, n_in);
  }
  Rows y_of(std::vector<float>& y, int64_t rows, int64_t h) const {
    return column_slice(rows_of(y.data(), rows, heads * n_out), h * n_out, n_out);
  }
};

void expect_batch_equals_singles(Compute compute, int threads, int64_t heads, int64_t n_in,
                                 int64_t n_out, int64_t rows) {
  ThreadPool pool(threads);
  CpuBackend be(pool, compute);
  const Heads hs(be, heads, n_in, n_out);
  const auto x = random_vector(static_cast<size_t>(rows * hs.in_width()), 7);
  std::vector<float> want(static_cast<size_t>(rows * heads * n_out)), got(want.size(), NAN);
  std::vector<LinearCall> calls;
  for (int64_t h = 0; h < heads; ++h) {
    be.linear(hs.x_of(x, rows, h), hs.w[static_cast<size_t>(h)], hs.y_of(want, rows, h));
    calls.push_back({hs.x_of(x, rows, h), &hs.w[static_cast<size_t>(h)], hs.y_of(got, rows, h)});
  }
  be.linears(calls);
  EXPECT_EQ(got, want) << "compute " << static_cast<int>(compute) << ", " << threads << " threads, "
                       << heads << " heads of " << n_out << " x " << n_in << ", " << rows
                       << " rows";
}

TEST(Linears, EqualsOneLinearPerCallBitForBit) {
  for (Compute compute : {Compute::kF32, Compute::kBF16}) {
    for (int threads : {1, 3}) {
      expect_batch_equals_singles(compute, threads, 16, 128, 512, 1);
      expect_batch_equals_singles(compute, threads, 5, 64, 48, 4);
      expect_batch_equals_singles(compute, threads, 3, 37, 21, 19);
      expect_batch_equals_singles(compute, threads, 2, 512, 128, 33);
    }
  }
}

TEST(Linears, RefusesBadCallsNamingTheWeight) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const Heads hs(be, 2, 8, 4);
  const auto x = random_vector(static_cast<size_t>(2 * hs.in_width()), 7);
  std::vector<float> y(2 * 2 * 4);
  std::vector<LinearCall> calls = {{hs.x_of(x, 2, 0), &hs.w[0], hs.y_of(y, 2, 0)},
                                   {hs.x_of(x, 2, 1), nullptr, hs.y_of(y, 2, 1)}};
  EXPECT_THROW(be.linears(calls), Error);
  calls[1].w = &hs.w[1];
  calls[1].y.n_cols = 3;
  try {
    be.linears(calls);
    FAIL() << "a 3-column output of a 4-output weight was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head 1"), std::string::npos) << e.what();
  }
  calls[1].y.n_cols = 4;
  be.linears(calls);  // valid again
  be.linears({});     // nothing to do
}

}  // namespace
}  // namespace metrale
