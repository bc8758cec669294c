// The bf16-compute kernel (backend/cpu/linear_pairs.h): rounding matches core/dtype's
// f32_to_bf16; every path (vdpbf16ps where the CPU has it, its AVX-512F twin, the scalar
// loop) matches a scalar reference that rounds x to bf16 and sums in the kernel's order, bit
// for bit, over sizes, misaligned rows and row counts; through CpuBackend a row's result does
// not depend on the batch or the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear_pairs.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::random_bf16_matrix;

// The contract of linear_pairs.h written as a loop: x rounded to bf16, per pair the odd
// product then the even one added in f32 (each product is exact), then + bias.
void reference(ConstRows x, const uint16_t* w, int64_t n_out, int64_t n_in, const float* bias,
               Rows y) {
  for (int64_t r = 0; r < x.n_rows; ++r) {
    for (int64_t o = 0; o < n_out; ++o) {
      float acc = 0.0f;
      for (int64_t p = 0; p < n_in / 2; ++p) {
        for (int64_t k : {2 * p + 1, 2 * p}) {
          const float xk = bf16_to_f32(f32_to_bf16(x.row(r)[k]));
          const float prod = xk * bf16_to_f32(w[o * n_in + k]);
          acc = acc + prod;
        }
      }
      y.row(r)[o] = bias != nullptr ? acc + bias[o] : acc;
    }
  }
}

TEST(LinearPairs, RoundingMatchesDtype) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.0f,    -0.0f,         1.0f,           -1.5f,   inf,
                          -inf,    std::nanf(""), -std::nanf(""), 3.4e38f, 1e-40f,
                          -1e-42f, 1.00390625f,   1.01171875f,    65504.0f};
  // Ties: the bf16 halfway points round to even.
  for (uint32_t bits : {0x3F808000u, 0x3F818000u, 0x7F7F8000u, 0x00008000u, 0xBF808000u}) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    x.push_back(f);
  }
  const auto random = testing::random_vector(200, 9, -1e5f, 1e5f);
  x.insert(x.end(), random.begin(), random.end());
  std::vector<uint16_t> out(x.size());
  const ConstRows rows{.data = x.data(),
                       .n_rows = 1,
                       .n_cols = static_cast<int64_t>(x.size()),
                       .stride = static_cast<int64_t>(x.size())};
  cpu::round_rows_bf16(rows, 0, 1, out.data());
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(out[i], f32_to_bf16(x[i])) << "value " << i << " = " << x[i];
}

TEST(LinearPairs, PackUnpackRoundTrip) {
  for (int64_t n_out : {1, 16, 17, 40}) {
    for (int64_t n_in : {2, 6, 64}) {
      const auto w = random_bf16_matrix(n_out, n_in, 4);
      std::vector<uint16_t> packed(cpu::pairs_bf16_bytes(n_out, n_in) / 2, 0xFFFF);
      cpu::pack_pairs_bf16(w.data(), n_out, n_in, packed.data());
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t o = 0; o < n_out; ++o) {
        cpu::unpack_pairs_row(packed.data(), n_in, o, row.data());
        for (int64_t k = 0; k < n_in; ++k)
          ASSERT_EQ(row[k], bf16_to_f32(w[o * n_in + k])) << o << "," << k;
      }
    }
  }
}

// Kernel vs reference, bit for bit, over shapes, misalignments, row counts, bias or not, on
// both instruction paths.
TEST(LinearPairs, KernelMatchesReference) {
  int checked = 0;
  std::vector<cpu::PairsPath> paths = {cpu::PairsPath::kAuto, cpu::PairsPath::kScalar};
  if (cpu::pairs_bf16_simd()) paths.push_back(cpu::PairsPath::kAvx512F);  // the twin, when distinct
  if (cpu::pairs_bf16_avx2()) paths.push_back(cpu::PairsPath::kAvx2);
  for (cpu::PairsPath path : paths) {
    for (int64_t n_in : {2, 30, 64, 258}) {
      for (int64_t n_out : {1, 15, 16, 33, 50, 100}) {
        for (int64_t rows : {1, 3, 8, 9, 19, 40}) {  // 40: prefetching the next tile
          for (size_t offset : {size_t{0}, size_t{3}}) {
            SCOPED_TRACE(::testing::Message()
                         << "path " << static_cast<int>(path) << " n_in " << n_in << " n_out "
                         << n_out << " rows " << rows << " offset " << offset);
            const auto w = random_bf16_matrix(n_out, n_in, static_cast<uint32_t>(n_in * 7 + n_out));
            std::vector<uint16_t> packed(cpu::pairs_bf16_bytes(n_out, n_in) / 2 + 32);
            // pack into a 64-byte aligned start (the kernel's weight loads are aligned)
            auto* base = reinterpret_cast<uint16_t*>(
                (reinterpret_cast<uintptr_t>(packed.data()) + 63) / 64 * 64);
            cpu::pack_pairs_bf16(w.data(), n_out, n_in, base);
            const int64_t x_stride = n_in + 5;
            testing::Floats x(static_cast<size_t>(rows * x_stride), offset);
            testing::fill_uniform(x.data(), static_cast<size_t>(rows * x_stride), 77, -3.0f, 3.0f);
            const auto bias = testing::random_vector(static_cast<size_t>(n_out), 5);
            const float* b = n_out % 2 == 0 ? bias.data() : nullptr;
            const ConstRows xr{
                .data = x.data(), .n_rows = rows, .n_cols = n_in, .stride = x_stride};
            std::vector<uint16_t> xb(static_cast<size_t>(rows * n_in));
            cpu::round_rows_bf16(xr, 0, rows, xb.data());
            const int64_t y_stride = n_out + 3;
            testing::Floats y(static_cast<size_t>(rows * y_stride), offset + 1);
            std::vector<float> want(static_cast<size_t>(rows * n_out));
            reference(xr, w.data(), n_out, n_in, b,
                      {.data = want.data(), .n_rows = rows, .n_cols = n_out, .stride = n_out});
            const cpu::PairsTask task{
                .x = xb.data(),
                .n_rows = rows,
                .w = base,
                .n_in = n_in,
                .n_out = n_out,
                .bias = b,
                .y = {.data = y.data(), .n_rows = rows, .n_cols = n_out, .stride = y_stride}};
            // Two thread-like shares of the outputs (the split is in units of 16).
            const int64_t mid = n_out > 16 ? 16 : n_out;
            cpu::linear_bf16_pairs(task, 0, mid, path);
            if (mid < n_out) cpu::linear_bf16_pairs(task, mid, n_out, path);
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t o = 0; o < n_out; ++o) {
                ASSERT_EQ(testing::as_bits(y[static_cast<size_t>(r * y_stride + o)]),
                          testing::as_bits(want[static_cast<size_t>(r * n_out + o)]))
                    << "row " << r << " out " << o;
              }
              // the stride padding after each row is never written
              for (int64_t o = n_out; o < y_stride && r + 1 < rows; ++o) {
                ASSERT_EQ(y[static_cast<size_t>(r * y_stride + o)], 0.0f);
              }
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int>(paths.size()) * 4 * 6 * 6 * 2);
}

// Through the backend: prepare(kCopy) under Compute::kBF16 packs pairs; each row's output is
// the same bits alone, in any batch, on 1 or 2 threads; and it sits within bf16 rounding of
// the f32 path.
TEST(LinearPairs, BackendBatchAndThreadInvariant) {
  const int64_t n_in = 320, n_out = 200, rows = 21;
  const auto w = random_bf16_matrix(n_out, n_in, 12);
  const auto bias16 = random_bf16_matrix(1, n_out, 13);
  const WeightTensor plain{.name = "w",
                           .format = WeightFormat::kBF16,
                           .n_out = n_out,
                           .n_in = n_in,
                           .data = w.data(),
                           .bias = bias16.data(),
                           .bias_dtype = DType::kBF16};
  const auto x = testing::random_vector(static_cast<size_t>(rows * n_in), 14);
  const ConstRows all{.data = x.data(), .n_rows = rows, .n_cols = n_in, .stride = n_in};

  ThreadPool one(1), two(2);
  CpuBackend bf16_1(one, Compute::kBF16), bf16_2(two, Compute::kBF16), f32_2(two);
  const WeightTensor p1 = bf16_1.prepare(plain, PrepareMode::kCopy);
  const WeightTensor p2 = bf16_2.prepare(plain, PrepareMode::kCopy);
  const WeightTensor pf = f32_2.prepare(plain, PrepareMode::kCopy);
  EXPECT_EQ(p1.packing, cpu::kPackingBf16Pairs);
  EXPECT_NE(pf.packing, cpu::kPackingBf16Pairs);

  std::vector<float> batched(static_cast<size_t>(rows * n_out)), on_one(batched.size()),
      f32(batched.size());
  bf16_2.linear(all, p2,
                {.data = batched.data(), .n_rows = rows, .n_cols = n_out, .stride = n_out});
  bf16_1.linear(all, p1, {.data = on_one.data(), .n_rows = rows, .n_cols = n_out, .stride = n_out});
  f32_2.linear(all, pf, {.data = f32.data(), .n_rows = rows, .n_cols = n_out, .stride = n_out});
  for (size_t i = 0; i < batched.size(); ++i)
    ASSERT_EQ(testing::as_bits(batched[i]), testing::as_bits(on_one[i])) << i;

  // Every row alone, and rows in sub-batches of 4 starting at odd offsets.
  std::vector<float> part(static_cast<size_t>(4 * n_out));
  for (int64_t r0 = 0; r0 < rows; r0 += 3) {
    const int64_t n = std::min<int64_t>(r0 % 2 == 0 ? 1 : 4, rows - r0);
    bf16_2.linear({.data = x.data() + r0 * n_in, .n_rows = n, .n_cols = n_in, .stride = n_in}, p2,
                  {.data = part.data(), .n_rows = n, .n_cols = n_out, .stride = n_out});
    for (int64_t i = 0; i < n * n_out; ++i) {
      ASSERT_EQ(testing::as_bits(part[static_cast<size_t>(i)]),
                testing::as_bits(batched[static_cast<size_t>(r0 * n_out + i)]))
          << "row " << r0 + i / n_out << " out " << i % n_out << " in a batch of " << n;
    }
  }
  // bf16 activations vs f32: |x| <= 1, |w| <= 1, so the rounding error of a sum of n_in
  // products is below n_in * 2^-8 in the worst case; typical ~1e-2.
  double max_err = 0.0;
  for (size_t i = 0; i < f32.size(); ++i)
    max_err = std::max(max_err, static_cast<double>(std::fabs(f32[i] - batched[i])));
  EXPECT_LT(max_err, 0.1);
  EXPECT_GT(max_err, 0.0);  // the mode really rounds
}

TEST(LinearPairs, EmbeddingReadsPairPackedTable) {
  const int64_t vocab = 40, dim = 64;
  const auto w = random_bf16_matrix(vocab, dim, 21);
  ThreadPool pool(2);
  CpuBackend backend(pool, Compute::kBF16);
  const WeightTensor table = backend.prepare({.name = "embed",
                                              .format = WeightFormat::kBF16,
                                              .n_out = vocab,
                                              .n_in = dim,
                                              .data = w.data()},
                                             PrepareMode::kCopy);
  ASSERT_EQ(table.packing, cpu::kPackingBf16Pairs);
  const std::vector<int32_t> ids = {0, 39, 17, 16, 5};
  std::vector<float> out(ids.size() * dim);
  backend.embedding(table, ids, {.data = out.data(), .n_rows = 5, .n_cols = dim, .stride = dim});
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t k = 0; k < dim; ++k) {
      ASSERT_EQ(out[i * dim + static_cast<size_t>(k)],
                bf16_to_f32(w[static_cast<size_t>(ids[i] * dim + k)]));
    }
  }
}

}  // namespace
}  // namespace metrale
