// rms_norm, rope, gated activations, embedding and argmax: every SIMD target against the
// scalar references, over widths around the vector sizes and misaligned rows.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reference.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "layers/rope_table.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::Floats;

const int64_t kWidths[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 129};

TEST(RmsNorm, MatchesReferenceOnEveryTarget) {
  for (int64_t n : kWidths) {
    for (int64_t group : {int64_t{0}, int64_t{1}, n}) {
      for (NormStyle style : {NormStyle::kWeight, NormStyle::kOnePlusWeight}) {
        for (bool residual : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " group=" << group
                                            << " style=" << int(style) << " residual=" << residual);
          const int64_t rows = 3, g = group > 0 ? group : n;
          const size_t total = static_cast<size_t>(rows * n);
          const auto x = testing::random_vector(total, 1, -3.0f, 3.0f);
          const auto h0 = testing::random_vector(total, 2);
          const auto w = testing::random_vector(static_cast<size_t>(g), 3);
          std::vector<float> ref_out(total), ref_h = h0;
          RmsNormArgs ra{.x = rows_of(x.data(), rows, n),
                         .out = rows_of(ref_out.data(), rows, n),
                         .weight = w.data(),
                         .eps = 1e-5f,
                         .style = style,
                         .group = group};
          if (residual) ra.residual = rows_of(ref_h.data(), rows, n);
          cpu::reference::rms_norm(ra);
          testing::for_each_target([&] {
            Floats xm(total, static_cast<size_t>(n % 3 + 1)), hm(total, 1), out(total, 2);
            std::copy(x.begin(), x.end(), xm.data());
            std::copy(h0.begin(), h0.end(), hm.data());
            RmsNormArgs a = ra;
            a.x = rows_of(static_cast<const float*>(xm.data()), rows, n);
            a.out = rows_of(out.data(), rows, n);
            a.residual = residual ? rows_of(hm.data(), rows, n) : Rows{};
            cpu::rms_norm_rows(a, 0, rows);
            for (size_t i = 0; i < total; ++i) {
              ASSERT_NEAR(out[i], ref_out[i], 2e-6f * (1.0f + std::abs(ref_out[i]))) << i;
              if (residual) {
                ASSERT_EQ(hm[i], ref_h[i]) << i;
              }
            }
          });
        }
      }
    }
  }
}

TEST(RmsNorm, InPlaceEqualsOutOfPlace) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  auto x = testing::random_vector(5 * 48, 4);
  const auto w = testing::random_vector(48, 5);
  std::vector<float> out(x.size());
  be.rms_norm(
      {.x = rows_of(x.data(), 5, 48), .out = rows_of(out.data(), 5, 48), .weight = w.data()});
  be.rms_norm({.x = rows_of(x.data(), 5, 48), .out = rows_of(x.data(), 5, 48), .weight = w.data()});
  EXPECT_EQ(x, out);
  EXPECT_THROW(be.rms_norm({.x = rows_of(x.data(), 5, 48),
                            .out = rows_of(out.data(), 5, 48),
                            .weight = w.data(),
                            .group = 5}),
               Error);
}

TEST(Rope, BitExactWithReferenceOnEveryTarget) {
  for (int64_t head_dim : {2, 6, 16, 34, 64, 128}) {
    for (double partial : {1.0, 0.5, 0.25}) {
      RopeTableConfig cfg{.theta = 10000.0, .head_dim = head_dim, .partial_rotary_factor = partial};
      if ((static_cast<int64_t>(static_cast<double>(head_dim) * partial)) % 2 != 0 ||
          static_cast<int64_t>(static_cast<double>(head_dim) * partial) < 2) {
        EXPECT_THROW(RopeTable::build(cfg, 8), Error);
        continue;
      }
      SCOPED_TRACE(::testing::Message() << "head_dim=" << head_dim << " partial=" << partial);
      const RopeTable table = RopeTable::build(cfg, 64);
      const int64_t rows = 4, heads = 3, n = heads * head_dim;
      const auto x = testing::random_vector(static_cast<size_t>(rows * n), 6);
      const std::vector<int32_t> pos = {0, 5, 63, 17};
      std::vector<float> ref = x;
      cpu::reference::rope({.x = rows_of(ref.data(), rows, n),
                            .n_heads = heads,
                            .head_dim = head_dim,
                            .positions = pos,
                            .table = table.cache()});
      testing::for_each_target([&] {
        Floats xm(x.size(), 3);
        std::copy(x.begin(), x.end(), xm.data());
        cpu::rope_rows({.x = rows_of(xm.data(), rows, n),
                        .n_heads = heads,
                        .head_dim = head_dim,
                        .positions = pos,
                        .table = table.cache()},
                       0, rows);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(xm[i], ref[i]) << i;
      });
    }
  }
}

TEST(Rope, RejectsPositionsOutsideTheTable) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const RopeTable table = RopeTable::build({.head_dim = 4}, 8);
  std::vector<float> x(8);
  const std::vector<int32_t> pos = {3, 8};
  EXPECT_THROW(be.rope({.x = rows_of(x.data(), 2, 4),
                        .n_heads = 1,
                        .head_dim = 4,
                        .positions = pos,
                        .table = table.cache()}),
               Error);
}

TEST(GatedActivation, MatchesReferenceOnEveryTarget) {
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    for (int64_t n : kWidths) {
      const int64_t rows = 2;
      const size_t total = static_cast<size_t>(rows * n);
      auto g = testing::random_vector(total, 7, -12.0f, 12.0f);
      const auto u = testing::random_vector(total, 8, -2.0f, 2.0f);
      std::vector<float> ref(total);
      cpu::reference::gated_activation({.gate = rows_of(g.data(), rows, n),
                                        .up = rows_of(u.data(), rows, n),
                                        .out = rows_of(ref.data(), rows, n),
                                        .act = act});
      testing::for_each_target([&] {
        Floats out(total, 1);
        cpu::gated_activation_rows({.gate = rows_of(g.data(), rows, n),
                                    .up = rows_of(u.data(), rows, n),
                                    .out = rows_of(out.data(), rows, n),
                                    .act = act},
                                   0, rows);
        for (size_t i = 0; i < total; ++i)
          ASSERT_NEAR(out[i], ref[i], 1e-6f + 4e-6f * std::abs(ref[i])) << "n=" << n << " i=" << i;
      });
    }
  }
}

TEST(Embedding, GathersF32AndBf16RowsAndRejectsBadIds) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t vocab = 11, dim = 19;
  const auto table = testing::random_vector(static_cast<size_t>(vocab * dim), 9);
  std::vector<uint16_t> table16(table.size());
  for (size_t i = 0; i < table.size(); ++i) table16[i] = f32_to_bf16(table[i]);
  const std::vector<int32_t> ids = {3, 0, 10, 3};
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16}) {
    const WeightTensor t{
        .name = "model.embed_tokens.weight",
        .format = f,
        .n_out = vocab,
        .n_in = dim,
        .data = f == WeightFormat::kF32 ? static_cast<const void*>(table.data()) : table16.data()};
    std::vector<float> out(ids.size() * dim);
    testing::for_each_target([&] {
      be.embedding(t, ids, rows_of(out.data(), 4, dim));
      for (size_t r = 0; r < ids.size(); ++r) {
        for (int64_t i = 0; i < dim; ++i) {
          const size_t src = static_cast<size_t>(ids[r] * dim + i);
          const float want = f == WeightFormat::kF32 ? table[src] : bf16_to_f32(table16[src]);
          ASSERT_EQ(out[r * dim + static_cast<size_t>(i)], want);
        }
      }
    });
    const std::vector<int32_t> bad = {1, 11};
    try {
      be.embedding(t, bad, rows_of(out.data(), 2, dim));
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("token id 11"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("embed_tokens"), std::string::npos) << e.message();
    }
  }
}

}  // namespace
}  // namespace metrale
