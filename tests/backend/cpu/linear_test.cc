// linear: every SIMD target against the double-precision reference, over sizes that hit
// every tail and tile remainder, misaligned and strided operands, both weight formats;
// then the determinism contract (a row alone == the same row in a batch, any thread count).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reference.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::Floats;

// Weight storage for either format, starting `offset` elements past a 64-byte boundary.
struct TestWeight {
  WeightFormat format;
  int64_t n_out, n_in;
  std::vector<uint8_t> storage;
  size_t offset_bytes;
  const void* data() const { return storage.data() + offset_bytes; }

  TestWeight(WeightFormat f, int64_t out, int64_t in, size_t offset, uint32_t seed)
      : format(f), n_out(out), n_in(in) {
    const size_t bytes = weight_row_bytes(f, in) * static_cast<size_t>(out);
    storage.resize(bytes + 128);
    const auto addr = reinterpret_cast<uintptr_t>(storage.data());
    const size_t elem = f == WeightFormat::kF32 ? 4 : 2;
    offset_bytes = (64 - addr % 64) % 64 + offset * elem;
    const auto values = testing::random_vector(static_cast<size_t>(out * in), seed);
    uint8_t* p = storage.data() + offset_bytes;
    for (size_t i = 0; i < values.size(); ++i) {
      if (f == WeightFormat::kF32) {
        std::memcpy(p + 4 * i, &values[i], 4);
      } else {
        const uint16_t h = f32_to_bf16(values[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
    }
  }
};

void run_kernel(WeightFormat f, const cpu::LinearTask& t, int64_t n_out) {
  if (f == WeightFormat::kF32) {
    cpu::linear_f32(t, 0, n_out);
  } else {
    cpu::linear_bf16(t, 0, n_out);
  }
}

void check_case(WeightFormat f, int64_t rows, int64_t n_out, int64_t n_in, bool with_bias,
                size_t misalign, int64_t pad) {
  SCOPED_TRACE(::testing::Message()
               << weight_format_name(f) << " rows=" << rows << " out=" << n_out << " in=" << n_in
               << " bias=" << with_bias << " misalign=" << misalign << " pad=" << pad);
  const TestWeight w(f, n_out, n_in, misalign, 11);
  const int64_t xs = n_in + pad, ys = n_out + pad;
  Floats x(static_cast<size_t>(rows * xs), misalign);
  testing::fill_uniform(x.data(), static_cast<size_t>(rows * xs), 7);
  const auto bias = testing::random_vector(static_cast<size_t>(n_out), 5);
  const float* b = with_bias ? bias.data() : nullptr;
  std::vector<float> ref(static_cast<size_t>(rows * n_out));
  const ConstRows xr{x.data(), rows, n_in, xs};
  cpu::reference::linear(xr, f, w.data(), n_out, n_in, b, rows_of(ref.data(), rows, n_out));
  // Error bound: a few ulps of the sum of |terms| (f32 accumulation over n_in products).
  std::vector<float> wrow(static_cast<size_t>(n_in));
  std::vector<double> bound(static_cast<size_t>(rows * n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    dequantize_row(f, static_cast<const char*>(w.data()) + o * weight_row_bytes(f, n_in), n_in,
                   wrow.data());
    for (int64_t r = 0; r < rows; ++r) {
      double s = with_bias ? std::abs(bias[static_cast<size_t>(o)]) : 0.0;
      for (int64_t i = 0; i < n_in; ++i)
        s += std::abs(static_cast<double>(xr.row(r)[i]) * wrow[static_cast<size_t>(i)]);
      bound[static_cast<size_t>(r * n_out + o)] =
          1e-6 + s * 4e-7 * std::sqrt(static_cast<double>(n_in) + 1.0);
    }
  }
  testing::for_each_target([&] {
    Floats y(static_cast<size_t>(rows * ys), misalign);
    for (int64_t i = 0; i < rows * ys; ++i) y[static_cast<size_t>(i)] = -777.0f;
    const cpu::LinearTask t{
        .x = xr, .w = w.data(), .n_in = n_in, .bias = b, .y = Rows{y.data(), rows, n_out, ys}};
    run_kernel(f, t, n_out);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < n_out; ++o) {
        const size_t i = static_cast<size_t>(r * n_out + o);
        ASSERT_NEAR(y[static_cast<size_t>(r * ys + o)], ref[i], bound[i])
            << "r=" << r << " o=" << o;
      }
      for (int64_t o = n_out; o < ys; ++o)
        ASSERT_EQ(y[static_cast<size_t>(r * ys + o)], -777.0f) << "pad written";
    }
  });
}

TEST(Linear, MatchesReferenceOnEveryTargetSmallShapes) {
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16}) {
    for (int64_t rows : {1, 2, 3, 4, 5, 9}) {
      for (int64_t n_in : {1, 3, 8, 15, 16, 17, 33, 64}) {
        for (int64_t n_out : {1, 3, 4, 6, 13}) {
          check_case(f, rows, n_out, n_in, (n_in + n_out) % 2 == 0, static_cast<size_t>(n_in % 3),
                     rows % 2);
        }
      }
    }
  }
}

TEST(Linear, MatchesReferenceAcrossGemmBlocks) {
  // n_in > 256 crosses a K slice; rows > 32 a row block; n_out > 32 a column block.
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16}) {
    check_case(f, 37, 70, 301, true, 1, 3);
    check_case(f, 4, 70, 600, false, 2, 0);
    check_case(f, 66, 35, 513, true, 0, 0);
  }
}

// The same row gives the same bits whether computed alone (GEMV), in a batch (GEMM), or
// with any number of threads.
TEST(Linear, RowResultIndependentOfBatchAndThreads) {
  const int64_t rows = 40, n_in = 300, n_out = 50;
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16}) {
    const TestWeight tw(f, n_out, n_in, 0, 3);
    const auto x = testing::random_vector(static_cast<size_t>(rows * n_in), 9);
    const auto bias = testing::random_vector(static_cast<size_t>(n_out), 10);
    const WeightTensor w{.name = "w",
                         .format = f,
                         .n_out = n_out,
                         .n_in = n_in,
                         .data = tw.data(),
                         .bias = bias.data()};
    std::vector<float> batch(static_cast<size_t>(rows * n_out));
    ThreadPool pool3(3);
    CpuBackend(pool3).linear(rows_of(x.data(), rows, n_in), w, rows_of(batch.data(), rows, n_out));
    ThreadPool pool1(1);
    CpuBackend one(pool1);
    for (int64_t r = 0; r < rows; r += 7) {
      for (int64_t width : {1, 2, 3}) {
        const int64_t n = std::min(width, rows - r);
        std::vector<float> alone(static_cast<size_t>(n * n_out));
        one.linear(rows_of(x.data() + r * n_in, n, n_in), w, rows_of(alone.data(), n, n_out));
        for (int64_t i = 0; i < n * n_out; ++i) {
          ASSERT_EQ(testing::as_bits(alone[static_cast<size_t>(i)]),
                    testing::as_bits(batch[static_cast<size_t>(r * n_out + i)]))
              << weight_format_name(f) << " row " << r + i / n_out << " width " << width;
        }
      }
    }
  }
}

TEST(Linear, RejectsMismatchedShapesNamingTheWeight) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  std::vector<float> wdata(12), x(8), y(8);
  const WeightTensor w{.name = "model.layers.0.mlp.up_proj.weight",
                       .format = WeightFormat::kF32,
                       .n_out = 3,
                       .n_in = 4,
                       .data = wdata.data()};
  try {
    be.linear(rows_of(x.data(), 2, 3), w, rows_of(y.data(), 2, 3));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("up_proj"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("[2, 4]"), std::string::npos) << e.message();
  }
  WeightTensor bf = w;
  std::vector<uint16_t> b16(3);
  bf.bias = b16.data();
  bf.bias_dtype = DType::kBF16;
  EXPECT_THROW(be.linear(rows_of(x.data(), 2, 4), bf, rows_of(y.data(), 2, 3)), Error);
  // prepare() widens the bf16 bias; the result then works.
  b16 = {f32_to_bf16(1.0f), f32_to_bf16(-2.0f), f32_to_bf16(0.5f)};
  const WeightTensor p = be.prepare(bf, PrepareMode::kInPlace);
  EXPECT_EQ(p.bias_dtype, DType::kF32);
  std::fill(x.begin(), x.end(), 0.0f);
  be.linear(rows_of(x.data(), 2, 4), p, rows_of(y.data(), 2, 3));
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[5], 0.5f);
}

TEST(Linear, PrepareCopyOwnsItsMemory) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t n_out = 5, n_in = 7;
  auto wdata = testing::random_vector(static_cast<size_t>(n_out * n_in), 1);
  const auto x = testing::random_vector(static_cast<size_t>(2 * n_in), 2);
  std::vector<float> y1(10), y2(10);
  const WeightTensor w{.name = "w",
                       .format = WeightFormat::kF32,
                       .n_out = n_out,
                       .n_in = n_in,
                       .data = wdata.data()};
  be.linear(rows_of(x.data(), 2, n_in), w, rows_of(y1.data(), 2, n_out));
  const WeightTensor copy = be.prepare(w, PrepareMode::kCopy);
  ASSERT_NE(copy.data, w.data);
  ASSERT_TRUE(copy.storage);
  std::fill(wdata.begin(), wdata.end(), 0.0f);  // the source may go away
  be.linear(rows_of(x.data(), 2, n_in), copy, rows_of(y2.data(), 2, n_out));
  EXPECT_EQ(y1, y2);
  WeightTensor bad = w;
  bad.n_in = 0;
  EXPECT_THROW(be.prepare(bad, PrepareMode::kCopy), Error);
}

}  // namespace
}  // namespace metrale
