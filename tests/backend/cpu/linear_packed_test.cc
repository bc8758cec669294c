// The packed bf16 path (backend/cpu/linear_packed.h): prepare(kCopy) repacks bf16 rows when
// the CPU runs the AVX-512 kernel; the result must match the double-precision reference,
// agree with the plain-row Highway kernel within rounding, give the same bits for a row
// alone / in a batch / on any thread count, and embedding lookups must read packed tables.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear_packed.h"
#include "backend/cpu/reference.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::random_bf16_matrix;

WeightTensor plain(const std::vector<uint16_t>& w, int64_t n_out, int64_t n_in, const float* bias) {
  return {.name = "w",
          .format = WeightFormat::kBF16,
          .n_out = n_out,
          .n_in = n_in,
          .data = w.data(),
          .bias = bias};
}

TEST(LinearPacked, PackUnpackRoundTrip) {
  for (int64_t n_out : {1, 16, 17, 40}) {
    for (int64_t n_in : {32, 96}) {
      const auto w = random_bf16_matrix(n_out, n_in, 4);
      std::vector<uint16_t> packed(cpu::packed_bf16_bytes(n_out, n_in) / 2, 0xFFFF);
      cpu::pack_bf16(w.data(), n_out, n_in, packed.data());
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t o = 0; o < n_out; ++o) {
        cpu::unpack_bf16_row(packed.data(), n_in, o, row.data());
        for (int64_t k = 0; k < n_in; ++k) {
          ASSERT_EQ(row[static_cast<size_t>(k)], bf16_to_f32(w[static_cast<size_t>(o * n_in + k)]))
              << "out=" << n_out << " in=" << n_in << " row " << o << " k " << k;
        }
      }
      // Padding rows of the last group are zero.
      for (int64_t o = n_out; o < (n_out + 15) / 16 * 16; ++o) {
        cpu::unpack_bf16_row(packed.data(), n_in, o, row.data());
        for (float v : row) ASSERT_EQ(v, 0.0f);
      }
    }
  }
}

TEST(LinearPacked, PrepareCopyPacksWhenTheCpuCan) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const auto w = random_bf16_matrix(20, 64, 1);
  const WeightTensor p = be.prepare(plain(w, 20, 64, nullptr), PrepareMode::kCopy);
  EXPECT_EQ(p.packing, cpu::packed_bf16_enabled() ? cpu::kPackingBf16x16 : 0u);
  // n_in not a multiple of 32 and in-place preparation keep plain rows.
  const auto odd = random_bf16_matrix(20, 40, 1);
  EXPECT_EQ(be.prepare(plain(odd, 20, 40, nullptr), PrepareMode::kCopy).packing, 0u);
  EXPECT_EQ(be.prepare(plain(w, 20, 64, nullptr), PrepareMode::kInPlace).packing, 0u);
}

TEST(LinearPacked, MatchesReferenceAndPlainKernel) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  for (int64_t rows : {1, 2, 3, 4, 5, 9, 17}) {
    for (int64_t n_out : {1, 15, 16, 17, 40}) {
      for (int64_t n_in : {32, 64, 320}) {
        const bool with_bias = (rows + n_out) % 2 == 0;
        SCOPED_TRACE(::testing::Message() << "rows=" << rows << " out=" << n_out << " in=" << n_in
                                          << " bias=" << with_bias);
        const auto w = random_bf16_matrix(n_out, n_in, 11);
        const auto bias = testing::random_vector(static_cast<size_t>(n_out), 5);
        const WeightTensor raw = plain(w, n_out, n_in, with_bias ? bias.data() : nullptr);
        const WeightTensor packed = be.prepare(raw, PrepareMode::kCopy);
        const int64_t ys = n_out + 3;  // strided output: the padding must stay untouched
        const auto x = testing::random_vector(static_cast<size_t>(rows * n_in), 7);
        std::vector<float> y(static_cast<size_t>(rows * ys), -777.0f),
            y_plain(static_cast<size_t>(rows * n_out));
        std::vector<float> ref(static_cast<size_t>(rows * n_out));
        be.linear(rows_of(x.data(), rows, n_in), packed, Rows{y.data(), rows, n_out, ys});
        be.linear(rows_of(x.data(), rows, n_in), raw, rows_of(y_plain.data(), rows, n_out));
        cpu::reference::linear(rows_of(x.data(), rows, n_in), WeightFormat::kBF16, w.data(), n_out,
                               n_in, raw.bias == nullptr ? nullptr : bias.data(),
                               rows_of(ref.data(), rows, n_out));
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t o = 0; o < n_out; ++o) {
            double mag = with_bias ? std::abs(bias[static_cast<size_t>(o)]) : 0.0;
            for (int64_t k = 0; k < n_in; ++k) {
              mag += std::abs(static_cast<double>(x[static_cast<size_t>(r * n_in + k)]) *
                              bf16_to_f32(w[static_cast<size_t>(o * n_in + k)]));
            }
            const double bound = 1e-6 + mag * 4e-7 * std::sqrt(static_cast<double>(n_in) + 1.0);
            const float got = y[static_cast<size_t>(r * ys + o)];
            ASSERT_NEAR(got, ref[static_cast<size_t>(r * n_out + o)], bound)
                << "r=" << r << " o=" << o;
            ASSERT_NEAR(got, y_plain[static_cast<size_t>(r * n_out + o)], 2 * bound)
                << "r=" << r << " o=" << o;
          }
          for (int64_t o = n_out; o < ys; ++o)
            ASSERT_EQ(y[static_cast<size_t>(r * ys + o)], -777.0f) << "pad written";
        }
      }
    }
  }
}

// Decode alone == co-batched == any thread count, bit for bit, on the packed path.
TEST(LinearPacked, RowResultIndependentOfBatchAndThreads) {
  const int64_t rows = 21, n_in = 96, n_out = 70;
  const auto w = random_bf16_matrix(n_out, n_in, 3);
  const auto bias = testing::random_vector(static_cast<size_t>(n_out), 10);
  const auto x = testing::random_vector(static_cast<size_t>(rows * n_in), 9);
  ThreadPool pool3(3), pool1(1);
  CpuBackend three(pool3), one(pool1);
  const WeightTensor p3 = three.prepare(plain(w, n_out, n_in, bias.data()), PrepareMode::kCopy);
  const WeightTensor p1 = one.prepare(plain(w, n_out, n_in, bias.data()), PrepareMode::kCopy);
  std::vector<float> batch(static_cast<size_t>(rows * n_out));
  three.linear(rows_of(x.data(), rows, n_in), p3, rows_of(batch.data(), rows, n_out));
  for (int64_t r = 0; r < rows; r += 5) {
    for (int64_t width : {1, 2, 3, 4, 5}) {
      const int64_t n = std::min(width, rows - r);
      std::vector<float> alone(static_cast<size_t>(n * n_out));
      one.linear(rows_of(x.data() + r * n_in, n, n_in), p1, rows_of(alone.data(), n, n_out));
      for (int64_t i = 0; i < n * n_out; ++i) {
        ASSERT_EQ(testing::as_bits(alone[static_cast<size_t>(i)]),
                  testing::as_bits(batch[static_cast<size_t>(r * n_out + i)]))
            << "row " << r + i / n_out << " width " << width;
      }
    }
  }
}

TEST(LinearPacked, EmbeddingReadsPackedTable) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t vocab = 37, dim = 64;
  const auto w = random_bf16_matrix(vocab, dim, 8);
  const WeightTensor table = be.prepare(plain(w, vocab, dim, nullptr), PrepareMode::kCopy);
  const std::vector<int32_t> ids = {0, 36, 17, 16, 17};
  std::vector<float> out(ids.size() * static_cast<size_t>(dim));
  be.embedding(table, ids, rows_of(out.data(), static_cast<int64_t>(ids.size()), dim));
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t k = 0; k < dim; ++k) {
      ASSERT_EQ(out[i * static_cast<size_t>(dim) + static_cast<size_t>(k)],
                bf16_to_f32(w[static_cast<size_t>(ids[i] * dim + k)]))
          << "id " << ids[i] << " k " << k;
    }
  }
}

}  // namespace
}  // namespace metrale
