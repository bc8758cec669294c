// Backend::lora on the CPU: y += scale_s * B_s (A_s x) per row against a double reference, with
// base rows, slots that do not adapt the weight, ranks below the pool's max (the padding is
// never read: it holds NaN here), bf16 storage, MoE experts, and rows that do not depend on
// the thread count or on which other rows share the call.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

struct Pool {
  int64_t slots, experts, R, in, out;
  DType dtype;
  std::vector<float> a, bt;  // f32 values: [slots * experts, R, in], [slots * experts, R, out]
  std::vector<uint16_t> a16, bt16;
  std::vector<int32_t> rank;
  std::vector<float> scale;

  Pool(int64_t s, int64_t e, int64_t r, int64_t n_in, int64_t n_out, DType d, uint32_t seed)
      : slots(s), experts(e), R(r), in(n_in), out(n_out), dtype(d) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    a.assign(static_cast<size_t>(s * e * r * in), NAN);
    bt.assign(static_cast<size_t>(s * e * r * out), NAN);
    for (int64_t k = 0; k < s; ++k) {
      rank.push_back(static_cast<int32_t>(k % 3 == 2 ? 0 : 1 + (k * 5) % r));
      scale.push_back(0.5f + 0.25f * static_cast<float>(k));
      for (int64_t x = 0; x < e; ++x)
        for (int64_t j = 0; j < rank.back(); ++j) {
          for (int64_t i = 0; i < in; ++i)
            a[static_cast<size_t>(((k * e + x) * r + j) * in + i)] = u(rng);
          for (int64_t o = 0; o < out; ++o)
            bt[static_cast<size_t>(((k * e + x) * r + j) * out + o)] = u(rng);
        }
    }
    if (d == DType::kBF16) {  // the f32 values become the bf16-rounded ones
      for (auto* v : {&a, &bt}) {
        std::vector<uint16_t>& dst = v == &a ? a16 : bt16;
        dst.resize(v->size());
        from_f32(v->data(), DType::kBF16, dst.data(), v->size());
        to_f32(dst.data(), DType::kBF16, v->data(), v->size());
      }
    }
  }
  LoraWeights weights() const {
    return {.a = dtype == DType::kBF16 ? static_cast<const void*>(a16.data()) : a.data(),
            .b = dtype == DType::kBF16 ? static_cast<const void*>(bt16.data()) : bt.data(),
            .dtype = dtype,
            .n_slots = slots,
            .n_experts = experts,
            .max_rank = R,
            .n_in = in,
            .n_out = out,
            .rank = rank.data(),
            .scale = scale.data()};
  }
  // y[o] + scale * sum_j B[o, j] sum_i A[j, i] x[i], in double.
  double ref(int32_t s, int64_t e, const float* x, float y, int64_t o) const {
    if (s < 0 || rank[static_cast<size_t>(s)] == 0) return y;
    double u = 0;
    for (int64_t j = 0; j < rank[static_cast<size_t>(s)]; ++j) {
      double t = 0;
      for (int64_t i = 0; i < in; ++i)
        t += double(a[static_cast<size_t>(((s * experts + e) * R + j) * in + i)]) * x[i];
      u += double(bt[static_cast<size_t>(((s * experts + e) * R + j) * out + o)]) * t;
    }
    return y + u * scale[static_cast<size_t>(s)];
  }
};

std::vector<float> randoms(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

class LoraOp : public ::testing::TestWithParam<DType> {};

TEST_P(LoraOp, MatchesTheReferenceRowByRow) {
  const int64_t n = 13, in = 70, out = 150, experts = 3;
  const Pool p(5, experts, 8, in, out, GetParam(), 1);
  const LoraWeights w = p.weights();
  const std::vector<float> x = randoms(static_cast<size_t>(n * in), 2);
  const std::vector<float> y0 = randoms(static_cast<size_t>(n * out), 3);
  // Rows: base, every slot (slot 2 adapts nothing), repeats out of order.
  const std::vector<int32_t> slots = {-1, 0, 1, 2, 3, 4, 1, -1, 4, 0, 0, 3, 1};
  ThreadPool two(2), one(1);
  CpuBackend be(two), be1(one);
  for (int64_t e : {int64_t{0}, int64_t{2}}) {
    std::vector<float> y = y0, y1 = y0;
    be.lora({.x = {x.data(), n, in, in},
             .y = {y.data(), n, out, out},
             .slots = slots,
             .weights = &w,
             .expert = e});
    be1.lora({.x = {x.data(), n, in, in},
              .y = {y1.data(), n, out, out},
              .slots = slots,
              .weights = &w,
              .expert = e});
    EXPECT_EQ(y, y1) << "thread count changed a result";
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        const size_t at = static_cast<size_t>(r * out + o);
        const double want = p.ref(slots[static_cast<size_t>(r)], e, x.data() + r * in, y0[at], o);
        ASSERT_NEAR(y[at], want, 1e-4 * (1 + std::abs(want))) << "row " << r << " out " << o;
        if (slots[static_cast<size_t>(r)] < 0 || slots[static_cast<size_t>(r)] == 2) {
          ASSERT_EQ(y[at], y0[at]) << "an unadapted row changed";
        }
      }
    }
    // A row alone gives the same bits as within the batch.
    for (int64_t r : {int64_t{1}, int64_t{8}}) {
      std::vector<float> alone(y0.begin() + r * out, y0.begin() + (r + 1) * out);
      be.lora({.x = {x.data() + r * in, 1, in, in},
               .y = {alone.data(), 1, out, out},
               .slots = std::span(slots).subspan(static_cast<size_t>(r), 1),
               .weights = &w,
               .expert = e});
      EXPECT_EQ(alone, std::vector<float>(y.begin() + r * out, y.begin() + (r + 1) * out));
    }
  }
}

TEST_P(LoraOp, BadArgumentsAreRefused) {
  const Pool p(2, 1, 4, 16, 16, GetParam(), 4);
  LoraWeights w = p.weights();
  std::vector<float> x(16), y(16);
  ThreadPool one(1);
  CpuBackend be(one);
  const std::vector<int32_t> bad = {2};
  EXPECT_THROW(
      be.lora(
          {.x = {x.data(), 1, 16, 16}, .y = {y.data(), 1, 16, 16}, .slots = bad, .weights = &w}),
      Error);
  const std::vector<int32_t> ok = {1};
  EXPECT_THROW(be.lora({.x = {x.data(), 1, 16, 16},
                        .y = {y.data(), 1, 16, 16},
                        .slots = ok,
                        .weights = &w,
                        .expert = 1}),
               Error);
  std::vector<int32_t> big_rank = {5, 5};
  w.rank = big_rank.data();
  EXPECT_THROW(
      be.lora({.x = {x.data(), 1, 16, 16}, .y = {y.data(), 1, 16, 16}, .slots = ok, .weights = &w}),
      Error);
}

INSTANTIATE_TEST_SUITE_P(Storage, LoraOp, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace metrale
