// The vision towers' ops: layer_norm, plain activations (GELU erf / tanh, quick GELU, SiLU),
// non-causal variable-length attention, merge_rows and tap_sum. SIMD kernels on every target
// against the scalar references; the backend ops' results independent of the thread count and of
// the other segments; bad arguments refused.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reference.h"
#include "core/thread_pool.h"
#include "support/test_support.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::Floats;

const int64_t kWidths[] = {1, 3, 8, 15, 16, 17, 32, 33, 80, 129};
constexpr Activation kActs[] = {Activation::kSilu, Activation::kGeluTanh, Activation::kGelu,
                                Activation::kQuickGelu};

TEST(LayerNorm, MatchesReferenceOnEveryTarget) {
  for (int64_t n : kWidths) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " bias=" << bias);
      const int64_t rows = 3;
      const size_t total = static_cast<size_t>(rows * n);
      // An offset mean, as a residual stream has: the two-pass variance keeps it exact.
      auto x = testing::random_vector(total, 1, -3.0f, 3.0f);
      for (float& v : x) v += 5.0f;
      const auto w = testing::random_vector(static_cast<size_t>(n), 2);
      const auto b = testing::random_vector(static_cast<size_t>(n), 3);
      std::vector<float> ref(total);
      const LayerNormArgs ra{.x = rows_of(x.data(), rows, n),
                             .out = rows_of(ref.data(), rows, n),
                             .weight = w.data(),
                             .bias = bias ? b.data() : nullptr,
                             .eps = 1e-6f};
      cpu::reference::layer_norm(ra);
      testing::for_each_target([&] {
        Floats xm(total, static_cast<size_t>(n % 3 + 1)), out(total, 2);
        std::copy(x.begin(), x.end(), xm.data());
        LayerNormArgs a = ra;
        a.x = rows_of(static_cast<const float*>(xm.data()), rows, n);
        a.out = rows_of(out.data(), rows, n);
        cpu::layer_norm_rows(a, 0, rows);
        for (size_t i = 0; i < total; ++i)
          ASSERT_NEAR(out[i], ref[i], 4e-6f * (1.0f + std::abs(ref[i]))) << i;
      });
    }
  }
}

TEST(Activation, EveryKindMatchesReferenceOnEveryTarget) {
  for (Activation act : kActs) {
    for (int64_t n : kWidths) {
      SCOPED_TRACE(::testing::Message() << activation_name(act) << " n=" << n);
      const int64_t rows = 2;
      const size_t total = static_cast<size_t>(rows * n);
      auto x = testing::random_vector(total, 7, -12.0f, 12.0f);
      x[0] = 0.0f;  // exact points
      if (total > 1) x[1] = -30.0f;
      std::vector<float> ref(total);
      cpu::reference::activation(
          {.x = rows_of(x.data(), rows, n), .out = rows_of(ref.data(), rows, n), .act = act});
      testing::for_each_target([&] {
        Floats out(total, 1);
        cpu::activation_rows(
            {.x = rows_of(x.data(), rows, n), .out = rows_of(out.data(), rows, n), .act = act}, 0,
            rows);
        for (size_t i = 0; i < total; ++i)
          ASSERT_NEAR(out[i], ref[i], 1e-6f + 2e-6f * std::abs(ref[i]))
              << "i=" << i << " x=" << x[i];
      });
    }
  }
}

TEST(Activation, GatedTakesEveryKindWithTheSameBits) {
  // gated_activation(g, u) == activation(g) * u, bit for bit: one formula per kind.
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t n = 37, rows = 3;
  const auto g = testing::random_vector(static_cast<size_t>(n * rows), 11, -6.0f, 6.0f);
  const auto u = testing::random_vector(static_cast<size_t>(n * rows), 12);
  for (Activation act : kActs) {
    std::vector<float> gated(g.size()), plain(g.size());
    be.gated_activation({.gate = rows_of(g.data(), rows, n),
                         .up = rows_of(u.data(), rows, n),
                         .out = rows_of(gated.data(), rows, n),
                         .act = act});
    be.activation(
        {.x = rows_of(g.data(), rows, n), .out = rows_of(plain.data(), rows, n), .act = act});
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_EQ(gated[i], plain[i] * u[i]) << activation_name(act);
  }
}

struct VarlenCase {
  int64_t n_heads, head_dim;
  std::vector<int32_t> cu;
};

std::vector<float> run_varlen(Backend& be, const VarlenCase& c, const std::vector<float>& qkv,
                              float scale = 0.0f) {
  const int64_t n = c.cu.back(), w = c.n_heads * c.head_dim;
  std::vector<float> out(static_cast<size_t>(n * w));
  // q | k | v side by side in one row of 3 w (the tower's fused qkv output).
  be.varlen_attention({.q = ConstRows{qkv.data(), n, w, 3 * w},
                       .k = ConstRows{qkv.data() + w, n, w, 3 * w},
                       .v = ConstRows{qkv.data() + 2 * w, n, w, 3 * w},
                       .out = rows_of(out.data(), n, w),
                       .cu_seqlens = c.cu,
                       .n_heads = c.n_heads,
                       .head_dim = c.head_dim,
                       .scale = scale});
  return out;
}

TEST(VarlenAttention, MatchesReferenceOnEveryTarget) {
  const VarlenCase cases[] = {{2, 16, {0, 5}},
                              {3, 80, {0, 64, 65, 100}},
                              {1, 3, {0, 1, 2, 19}},
                              {4, 33, {0, 17, 50, 83}},
                              {2, 64, {0, 150}}};
  for (const VarlenCase& c : cases) {
    for (float scale : {0.0f, 0.3f}) {
      SCOPED_TRACE(::testing::Message() << c.n_heads << "x" << c.head_dim << " rows " << c.cu.back()
                                        << " scale " << scale);
      const int64_t n = c.cu.back(), w = c.n_heads * c.head_dim;
      const auto qkv = testing::random_vector(static_cast<size_t>(n * 3 * w), 21, -2.0f, 2.0f);
      std::vector<float> ref(static_cast<size_t>(n * w));
      cpu::reference::varlen_attention({.q = ConstRows{qkv.data(), n, w, 3 * w},
                                        .k = ConstRows{qkv.data() + w, n, w, 3 * w},
                                        .v = ConstRows{qkv.data() + 2 * w, n, w, 3 * w},
                                        .out = rows_of(ref.data(), n, w),
                                        .cu_seqlens = c.cu,
                                        .n_heads = c.n_heads,
                                        .head_dim = c.head_dim,
                                        .scale = scale});
      ThreadPool pool(2);
      CpuBackend be(pool);
      testing::for_each_target([&] {
        const std::vector<float> out = run_varlen(be, c, qkv, scale);
        // f32 scores over head_dim products of O(1) values: ~1e-6 relative per exp.
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], ref[i], 1e-5f * (1.0f + std::abs(ref[i]))) << i;
      });
    }
  }
}

TEST(VarlenAttention, ARowDependsOnlyOnItsSegmentAndNotOnThreads) {
  const VarlenCase all{2, 40, {0, 30, 47, 90}};
  const int64_t w = all.n_heads * all.head_dim;
  const auto qkv = testing::random_vector(static_cast<size_t>(90 * 3 * w), 5, -2.0f, 2.0f);
  ThreadPool one(1), two(2);
  CpuBackend be1(one), be2(two);
  const std::vector<float> a = run_varlen(be1, all, qkv);
  EXPECT_EQ(a, run_varlen(be2, all, qkv));
  // The middle segment alone gives its rows' results, bit for bit.
  const std::vector<float> mid(qkv.begin() + 30 * 3 * w, qkv.begin() + 47 * 3 * w);
  const std::vector<float> alone = run_varlen(be2, {2, 40, {0, 17}}, mid);
  EXPECT_EQ(alone, std::vector<float>(a.begin() + 30 * w, a.begin() + 47 * w));
}

TEST(VarlenAttention, BadArgumentsAreRefused) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const std::vector<float> qkv(static_cast<size_t>(6 * 3 * 8));
  std::vector<float> sink(48);
  auto err = [&](std::vector<int32_t> cu) {
    return test::error_of([&] {
      be.varlen_attention({.q = ConstRows{qkv.data(), 6, 8, 24},
                           .k = ConstRows{qkv.data() + 8, 6, 8, 24},
                           .v = ConstRows{qkv.data() + 16, 6, 8, 24},
                           .out = rows_of(sink.data(), 6, 8),
                           .cu_seqlens = cu,
                           .n_heads = 2,
                           .head_dim = 4});
    });
  };
  EXPECT_EQ(
      err({0, 3, 3, 6}),
      "varlen_attention: cu_seqlens[2] = 3 does not exceed cu_seqlens[1] = 3 (empty segment)");
  EXPECT_EQ(
      err({0, 5}),
      "varlen_attention: cu_seqlens must run from 0 to the 6 rows; found 2 values from 0 to 5");
  EXPECT_NE(err({1, 6}).find("cu_seqlens must run from 0 to the 6 rows"), std::string::npos);
  std::vector<float> out(48);
  EXPECT_NE(test::error_of([&] {
              be.varlen_attention({.q = rows_of(qkv.data(), 6, 8),
                                   .k = rows_of(qkv.data(), 6, 8),
                                   .v = rows_of(qkv.data(), 6, 8),
                                   .out = rows_of(const_cast<float*>(qkv.data()), 6, 8),
                                   .cu_seqlens = std::vector<int32_t>{0, 6},
                                   .n_heads = 2,
                                   .head_dim = 4});
            }).find("out overlaps an input"),
            std::string::npos);
}

TEST(MergeRows, GroupsConsecutiveRowsSideBySide) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t n = 8, c = 5;
  const auto x = testing::random_vector(static_cast<size_t>(n * c), 3);
  std::vector<float> out(static_cast<size_t>(n * c));
  // Padded input rows (stride 7): the merged row is the contiguous view torch makes.
  std::vector<float> padded(static_cast<size_t>(n * 7));
  for (int64_t r = 0; r < n; ++r) std::copy_n(x.data() + r * c, c, padded.data() + r * 7);
  be.merge_rows(ConstRows{padded.data(), n, c, 7}, rows_of(out.data(), n / 4, 4 * c));
  EXPECT_EQ(out, x);
  EXPECT_EQ(test::error_of([&] {
              be.merge_rows(ConstRows{x.data(), n, c, c}, rows_of(out.data(), 3, 4 * c));
            }),
            "merge_rows: [8, 5] does not regroup into [3, 20]");
}

TEST(TapSum, MatchesReferenceAndAddsToOut) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  for (const int64_t c : {int64_t{1}, int64_t{17}, int64_t{64}, int64_t{129}}) {
    const int64_t n = 9, k = 4, table_rows = 16;
    const auto table = testing::random_vector(static_cast<size_t>(table_rows * c), 5);
    const auto w = testing::random_vector(static_cast<size_t>(n * k), 6);
    std::vector<int32_t> taps(static_cast<size_t>(n * k));
    for (size_t i = 0; i < taps.size(); ++i) taps[i] = static_cast<int32_t>((i * 7 + 3) % 16);
    const auto start = testing::random_vector(static_cast<size_t>(n * c), 7);
    std::vector<float> got = start, want = start;
    const TapSumArgs a{.table = table.data(),
                       .table_rows = table_rows,
                       .taps = taps,
                       .weights = w,
                       .n_taps = k,
                       .out = rows_of(got.data(), n, c)};
    be.tap_sum(a);
    TapSumArgs ra = a;
    ra.out = rows_of(want.data(), n, c);
    cpu::reference::tap_sum(ra);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f) << c << " " << i;
    // Row 0 by hand: its taps' weighted sum added to what out held.
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += w[j] * table[taps[j] * c];
    EXPECT_EQ(got[0], start[0] + sum);
  }
}

TEST(TapSum, BadArgumentsAreRefused) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  std::vector<float> table(8), out(4), w(4, 0.25f);
  std::vector<int32_t> taps = {0, 1, 2, 4};
  TapSumArgs a{.table = table.data(),
               .table_rows = 4,
               .taps = taps,
               .weights = w,
               .n_taps = 4,
               .out = rows_of(out.data(), 1, 2)};
  EXPECT_EQ(test::error_of([&] { be.tap_sum(a); }), "tap_sum: tap 3 names row 4 of the table's 4");
  a.weights = std::span<const float>(w).first(3);
  EXPECT_EQ(test::error_of([&] { be.tap_sum(a); }),
            "tap_sum: expected 4 taps and weights (1 rows x 4), found 4 and 3");
}

}  // namespace
}  // namespace metrale
