// The MoE ops: route against a direct softmax / top-k, and moe against a per-row loop over
// the chosen experts (each expert through the backend's own linear, so the comparison is exact
// arithmetic for arithmetic); a row's result is the same alone, co-batched and on 1 or 3
// threads, for f32 weights, packed bf16 and bf16 compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::random_bf16_matrix;
using testing::random_vector;

constexpr int64_t kH = 96, kI = 40, kE = 12, kK = 3;

struct Experts {
  std::vector<std::vector<uint16_t>> raw;  // keeps the source rows alive
  std::vector<MoeExpertWeights> w;
};

Experts make_experts(Backend& be, uint32_t seed) {
  Experts e;
  for (int64_t i = 0; i < kE; ++i) {
    e.raw.push_back(random_bf16_matrix(2 * kI, kH, seed + 2 * static_cast<uint32_t>(i)));
    e.raw.push_back(random_bf16_matrix(kH, kI, seed + 2 * static_cast<uint32_t>(i) + 1));
    const WeightTensor gu{.name = "gate_up",
                          .format = WeightFormat::kBF16,
                          .n_out = 2 * kI,
                          .n_in = kH,
                          .data = e.raw[e.raw.size() - 2].data()};
    const WeightTensor dn{.name = "down",
                          .format = WeightFormat::kBF16,
                          .n_out = kH,
                          .n_in = kI,
                          .data = e.raw.back().data()};
    e.w.push_back({be.prepare(gu, PrepareMode::kCopy), be.prepare(dn, PrepareMode::kCopy)});
  }
  return e;
}

// Routing for n rows: distinct experts per row, weights in (0, 1).
void make_routes(int64_t n, uint32_t seed, std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.clear();
  w = random_vector(static_cast<size_t>(n * kK), seed, 0.05f, 1.0f);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int32_t> all(kE);
    std::iota(all.begin(), all.end(), 0);
    std::rotate(all.begin(), all.begin() + (r * 5 + static_cast<int64_t>(seed)) % kE, all.end());
    std::swap(all[1], all[static_cast<size_t>(2 + r % 7)]);
    ids.insert(ids.end(), all.begin(), all.begin() + kK);
  }
}

// out[r] = sum over the row's experts in ascending id of w * down(silu(gate) * up), through
// the backend's linear and gated_activation one row at a time.
std::vector<float> per_row(Backend& be, const Experts& e, const std::vector<float>& x,
                           const std::vector<int32_t>& ids, const std::vector<float>& w,
                           int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * kH), 0.0f), gu(2 * kI), y(kH);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> order(kK);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return ids[r * kK + a] < ids[r * kK + b]; });
    for (int64_t j : order) {
      const MoeExpertWeights& ew = e.w[static_cast<size_t>(ids[static_cast<size_t>(r * kK + j)])];
      be.linear(rows_of(x.data() + r * kH, 1, kH), ew.gate_up, rows_of(gu.data(), 1, 2 * kI));
      const Rows g = rows_of(gu.data(), 1, kI);
      be.gated_activation({.gate = g, .up = rows_of(gu.data() + kI, 1, kI), .out = g});
      be.linear(g, ew.down, rows_of(y.data(), 1, kH));
      for (int64_t d = 0; d < kH; ++d)
        out[static_cast<size_t>(r * kH + d)] +=
            y[static_cast<size_t>(d)] * w[static_cast<size_t>(r * kK + j)];
    }
  }
  return out;
}

std::vector<float> run_moe(Backend& be, const Experts& e, const std::vector<float>& x,
                           const std::vector<int32_t>& ids, const std::vector<float>& w,
                           int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * kH), NAN);
  be.moe({.x = rows_of(x.data(), n, kH),
          .experts = ids,
          .weights = w,
          .top_k = kK,
          .expert_weights = e.w,
          .out = rows_of(out.data(), n, kH)});
  return out;
}

TEST(Moe, EqualsPerRowExpertsAndIgnoresItsCompany) {
  for (Compute compute : {Compute::kF32, Compute::kBF16}) {
    SCOPED_TRACE(compute == Compute::kF32 ? "f32 compute" : "bf16 compute");
    ThreadPool pool3(3), pool1(1);
    CpuBackend be(pool3, compute), one(pool1, compute);
    const Experts e = make_experts(be, 40);
    const int64_t n = 37;
    const auto x = random_vector(static_cast<size_t>(n * kH), 7, -2.0f, 2.0f);
    std::vector<int32_t> ids;
    std::vector<float> w;
    make_routes(n, 3, ids, w);
    const std::vector<float> all = run_moe(be, e, x, ids, w, n);
    EXPECT_EQ(all, per_row(be, e, x, ids, w, n));
    // Each row alone, on one thread: the same bits.
    for (int64_t r = 0; r < n; r += 5) {
      const std::vector<float> xr(x.begin() + r * kH, x.begin() + (r + 1) * kH);
      const std::vector<int32_t> ir(ids.begin() + r * kK, ids.begin() + (r + 1) * kK);
      const std::vector<float> wr(w.begin() + r * kK, w.begin() + (r + 1) * kK);
      const std::vector<float> alone = run_moe(one, e, xr, ir, wr, 1);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + r * kH)) << "row " << r;
    }
  }
}

TEST(Moe, RouteIsSoftmaxTopKWithOptionalRenormalisation) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t n = 9;
  auto logits = random_vector(static_cast<size_t>(n * kE), 11, -3.0f, 3.0f);
  logits[5] = logits[7];  // a tie: the lower expert comes first
  for (bool normalize : {false, true}) {
    std::vector<int32_t> ids(static_cast<size_t>(n * kK));
    std::vector<float> w(ids.size());
    be.route({.logits = rows_of(logits.data(), n, kE),
              .top_k = kK,
              .normalize = normalize,
              .experts = ids,
              .weights = w});
    for (int64_t r = 0; r < n; ++r) {
      const float* l = logits.data() + r * kE;
      std::vector<double> p(kE);
      double sum = 0;
      for (int64_t i = 0; i < kE; ++i)
        sum += p[static_cast<size_t>(i)] = std::exp(static_cast<double>(l[i]));
      std::vector<int32_t> order(kE);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return l[a] > l[b]; });
      double top = 0;
      for (int64_t j = 0; j < kK; ++j)
        top += p[static_cast<size_t>(order[static_cast<size_t>(j)])] / sum;
      for (int64_t j = 0; j < kK; ++j) {
        EXPECT_EQ(ids[static_cast<size_t>(r * kK + j)], order[static_cast<size_t>(j)])
            << "row " << r << " choice " << j;
        const double want =
            p[static_cast<size_t>(order[static_cast<size_t>(j)])] / sum / (normalize ? top : 1.0);
        EXPECT_NEAR(w[static_cast<size_t>(r * kK + j)], want, 1e-6)
            << "row " << r << " choice " << j;
      }
    }
  }
}

// DeepseekV3TopkRouter: sigmoid, + bias for the choice, groups by their top-2 sum.
TEST(Moe, SigmoidRouteKeepsTheBestGroupsAndWeighsByUnbiasedScores) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t n = 7, groups = 4, per = kE / groups, keep = 2;
  const auto logits = random_vector(static_cast<size_t>(n * kE), 21, -3.0f, 3.0f);
  const auto bias = random_vector(kE, 22, -0.3f, 0.3f);
  for (bool normalize : {false, true}) {
    std::vector<int32_t> ids(static_cast<size_t>(n * kK));
    std::vector<float> w(ids.size());
    be.route({.logits = rows_of(logits.data(), n, kE),
              .top_k = kK,
              .normalize = normalize,
              .experts = ids,
              .weights = w,
              .scoring = RouteScoring::kSigmoid,
              .correction_bias = bias,
              .n_group = groups,
              .topk_group = keep,
              .scale = 2.5f});
    for (int64_t r = 0; r < n; ++r) {
      std::vector<double> p(kE), c(kE), g(groups);
      for (int64_t e = 0; e < kE; ++e) {
        p[e] = 1.0 / (1.0 + std::exp(-double{logits[static_cast<size_t>(r * kE + e)]}));
        c[e] = p[e] + bias[static_cast<size_t>(e)];
      }
      for (int64_t q = 0; q < groups; ++q) {
        std::vector<double> m(c.begin() + q * per, c.begin() + (q + 1) * per);
        std::sort(m.rbegin(), m.rend());
        g[q] = m[0] + m[1];
      }
      std::vector<int64_t> gorder(groups);
      std::iota(gorder.begin(), gorder.end(), 0);
      std::stable_sort(gorder.begin(), gorder.end(),
                       [&](int64_t a, int64_t b) { return g[a] > g[b]; });
      std::vector<int32_t> order;
      for (int64_t e = 0; e < kE; ++e) {
        if (std::find(gorder.begin(), gorder.begin() + keep, e / per) != gorder.begin() + keep)
          order.push_back(static_cast<int32_t>(e));
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return c[a] > c[b]; });
      double total = 0;
      for (int64_t j = 0; j < kK; ++j) total += p[order[j]];
      for (int64_t j = 0; j < kK; ++j) {
        EXPECT_EQ(ids[static_cast<size_t>(r * kK + j)], order[j]) << "row " << r;
        const double want = p[order[j]] / (normalize ? total : 1.0) * 2.5;
        EXPECT_NEAR(w[static_cast<size_t>(r * kK + j)], want, 1e-5) << "row " << r;
      }
    }
  }
  std::vector<int32_t> ids(static_cast<size_t>(n * kK));
  std::vector<float> w(ids.size());
  RouteArgs bad{.logits = rows_of(logits.data(), n, kE),
                .top_k = kK,
                .experts = ids,
                .weights = w,
                .scoring = RouteScoring::kSigmoid,
                .correction_bias = bias,
                .n_group = 5,  // does not divide 12 experts
                .topk_group = 1};
  EXPECT_THROW(be.route(bad), Error);
  bad.n_group = 4;
  bad.topk_group = 5;
  EXPECT_THROW(be.route(bad), Error);
  bad.topk_group = 1;
  bad.correction_bias = std::span(bias).first(kE - 1);
  EXPECT_THROW(be.route(bad), Error);
}

TEST(Moe, RejectsBadRoutesAndShapes) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const Experts e = make_experts(be, 90);
  const auto x = random_vector(2 * kH, 1);
  std::vector<float> out(2 * kH), w(2 * kK, 0.5f);
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, kE};  // expert kE does not exist
  EXPECT_THROW(be.moe({.x = rows_of(x.data(), 2, kH),
                       .experts = ids,
                       .weights = w,
                       .top_k = kK,
                       .expert_weights = e.w,
                       .out = rows_of(out.data(), 2, kH)}),
               Error);
  ids.back() = 5;
  EXPECT_THROW(be.moe({.x = rows_of(x.data(), 2, kH),
                       .experts = std::span(ids).first(5),
                       .weights = w,
                       .top_k = kK,
                       .expert_weights = e.w,
                       .out = rows_of(out.data(), 2, kH)}),
               Error);
  EXPECT_THROW(be.moe({.x = rows_of(x.data(), 2, kH),
                       .experts = ids,
                       .weights = w,
                       .top_k = kK,
                       .expert_weights = std::span(e.w).first(2),
                       .out = rows_of(out.data(), 2, kH)}),
               Error);  // top_k 3 of 2 experts
  std::vector<float> logits(2 * kE);
  EXPECT_THROW(
      be.route(
          {.logits = rows_of(logits.data(), 2, kE), .top_k = kE + 1, .experts = ids, .weights = w}),
      Error);
}

}  // namespace
}  // namespace metrale
