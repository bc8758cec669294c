// The row-moving ops (gather_rows, scatter_rows, segment_sum, the LoRA token / head overlays)
// and the memory ops, against the loops they replaced in the engine, with their validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::random_vector;

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(RowOps, GatherRowsCopiesWholeRowsInOrder) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t n = 9, cols = 37, stride = 48;
  std::vector<float> x = random_vector(static_cast<size_t>(n * stride), 1);
  const std::vector<int32_t> rows = {4, 0, 8, 4};
  std::vector<float> out(rows.size() * 40, -7.0f);
  be.gather_rows({x.data(), n, cols, stride}, rows, {out.data(), 4, cols, 40});
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(out[i * 40 + static_cast<size_t>(c)], x[static_cast<size_t>(rows[i] * stride + c)]);
    EXPECT_EQ(out[i * 40 + cols], -7.0f);  // past the row: untouched
  }
  const std::vector<int32_t> bad = {9};
  EXPECT_EQ(error_of([&] {
              be.gather_rows({x.data(), n, cols, stride}, bad, {out.data(), 1, cols, 40});
            }),
            "gather_rows: row 0 names row 9 of x's 9");
  EXPECT_NE(error_of([&] {
              be.gather_rows({x.data(), n, cols, stride}, rows, {out.data(), 3, cols, 40});
            }).find("expected [4, 37], found [3, 37]"),
            std::string::npos);
}

TEST(RowOps, TokenOverlayReplacesTheRowsOfSlotsWithOverlays) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const int64_t V = 11, H = 5;
  const std::vector<float> embed = random_vector(static_cast<size_t>(V * H), 2);
  const std::vector<int32_t> tok_ids = {3, 7};
  const std::vector<float> tok_rows = random_vector(static_cast<size_t>(2 * H), 3);
  std::vector<LoraSlotOverlay> overlays(3);
  overlays[0] = {.embed = embed.data()};  // saved table
  overlays[1] = {
      .token_ids = tok_ids.data(), .token_rows = tok_rows.data(), .n_tokens = 2};  // tokens
  overlays[2] = {.embed = embed.data(),
                 .token_ids = tok_ids.data(),
                 .token_rows = tok_rows.data(),
                 .n_tokens = 2};
  const std::vector<int32_t> ids = {3, 7, 3, 1, 7, 2};
  const std::vector<int32_t> slots = {-1, 1, 0, 1, 2, 2};
  std::vector<float> h(ids.size() * H, 0.5f);
  be.token_overlay({.ids = ids, .slots = slots, .overlays = overlays, .h = {h.data(), 6, H, H}});
  auto row = [&](size_t r) {
    return std::vector<float>(h.begin() + static_cast<int64_t>(r) * H,
                              h.begin() + static_cast<int64_t>(r + 1) * H);
  };
  auto of = [&](const std::vector<float>& t, int64_t r) {
    return std::vector<float>(t.begin() + r * H, t.begin() + (r + 1) * H);
  };
  EXPECT_EQ(row(0), std::vector<float>(H, 0.5f));  // base row
  EXPECT_EQ(row(1), of(tok_rows, 1));              // trainable token 7
  EXPECT_EQ(row(2), of(embed, 3));                 // saved embed_tokens
  EXPECT_EQ(row(3), std::vector<float>(H, 0.5f));  // token 1 is not trainable
  EXPECT_EQ(row(4), of(tok_rows, 1));              // tokens win over the saved table
  EXPECT_EQ(row(5), of(embed, 2));
  const std::vector<int32_t> bad_slots = {-1, 1, 0, 1, 3, 2};
  EXPECT_EQ(error_of([&] {
              be.token_overlay(
                  {.ids = ids, .slots = bad_slots, .overlays = overlays, .h = {h.data(), 6, H, H}});
            }),
            "token_overlay: row 4 names slot 3 of 3");
}

TEST(RowOps, HeadOverlayEqualsALinearPerRowAndTiedTokenDots) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t V = 19, H = 24, n = 3;
  const std::vector<float> head_w = random_vector(static_cast<size_t>(V * H), 4);
  const WeightTensor head = be.prepare(
      {.name = "head", .n_out = V, .n_in = H, .data = head_w.data()}, PrepareMode::kInPlace);
  const std::vector<int32_t> tok_ids = {2, 18};
  const std::vector<float> tok_rows = random_vector(static_cast<size_t>(2 * H), 5);
  std::vector<LoraSlotOverlay> overlays(2);
  overlays[0] = {.head = &head};
  overlays[1] = {.token_ids = tok_ids.data(),
                 .token_rows = tok_rows.data(),
                 .n_tokens = 2,
                 .tied_tokens = true};
  const std::vector<float> x = random_vector(static_cast<size_t>(n * H), 6);
  const std::vector<int32_t> slots = {0, -1, 1};
  std::vector<float> logits(static_cast<size_t>(n * V), 9.0f);
  be.head_overlay({.x = {x.data(), n, H, H},
                   .slots = slots,
                   .overlays = overlays,
                   .logits = {logits.data(), n, V, V}});
  std::vector<float> want(static_cast<size_t>(V));
  be.linear({x.data(), 1, H, H}, head, {want.data(), 1, V, V});
  for (int64_t v = 0; v < V; ++v)
    EXPECT_EQ(logits[static_cast<size_t>(v)], want[static_cast<size_t>(v)]);
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(logits[static_cast<size_t>(V + v)], 9.0f);
  for (size_t k = 0; k < tok_ids.size(); ++k) {
    float acc = 0.0f;
    for (int64_t d = 0; d < H; ++d)
      acc += tok_rows[k * H + static_cast<size_t>(d)] * x[static_cast<size_t>(2 * H + d)];
    EXPECT_EQ(logits[static_cast<size_t>(2 * V + tok_ids[k])], acc);
  }
  EXPECT_EQ(logits[static_cast<size_t>(2 * V + 5)], 9.0f);
}

TEST(MemoryOps, UploadDownloadCopyZero) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  EXPECT_EQ(be.device(), Device::kHost);
  Buffer a = be.allocate(256), b = be.allocate(256);
  EXPECT_EQ(a.device(), Device::kHost);
  std::vector<uint8_t> host(256), back(256);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7);
  be.upload(a.data(), host.data(), 256);
  be.copy(b.data(), a.data(), 256);
  be.download(back.data(), b.data(), 256);
  EXPECT_EQ(back, host);
  be.zero(b.as<uint8_t>() + 16, 32);
  be.download(back.data(), b.data(), 256);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(back[i], i >= 16 && i < 48 ? 0 : host[i]) << i;
  be.copy(a.data(), a.data(), 256);  // onto itself: nothing
  EXPECT_EQ(error_of([&] { be.copy(a.as<uint8_t>() + 8, a.data(), 64); }),
            "copy: the ranges overlap");
  EXPECT_EQ(error_of([&] { be.upload(nullptr, host.data(), 4); }), "upload: null pointer");
  const DeviceFloats f(be, std::vector<float>{1.5f, -2.0f, 3.0f});
  ASSERT_EQ(f.size(), 3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % 64, 0u);
  EXPECT_EQ(f.data()[1], -2.0f);
  EXPECT_TRUE(DeviceFloats().empty());
}

TEST(RowOps, ScatterRowsReplacesOrAddsTheNamedRows) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const int64_t cols = 6;
  const std::vector<float> x = random_vector(static_cast<size_t>(2 * cols), 7);
  std::vector<float> out(static_cast<size_t>(4 * cols), 1.0f);
  const std::vector<int32_t> rows = {1, 3};
  be.scatter_rows({x.data(), 2, cols, cols}, rows, {out.data(), 4, cols, cols}, false);
  be.scatter_rows({x.data(), 2, cols, cols}, rows, {out.data(), 4, cols, cols}, true);
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_EQ(out[static_cast<size_t>(c)], 1.0f);
    EXPECT_EQ(out[static_cast<size_t>(cols + c)],
              x[static_cast<size_t>(c)] + x[static_cast<size_t>(c)]);
    EXPECT_EQ(out[static_cast<size_t>(3 * cols + c)], x[static_cast<size_t>(cols + c)] * 2);
  }
  const std::vector<int32_t> bad = {3, 1};
  EXPECT_EQ(error_of([&] {
              be.scatter_rows({x.data(), 2, cols, cols}, bad, {out.data(), 4, cols, cols}, false);
            }),
            "scatter_rows: rows must be ascending (row 1 names 1 after 3)");
}

TEST(RowOps, SegmentSumAddsEachSegmentsRowsInOrderOntoItsRow) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t n = 7, cols = 21, stride = 32;
  const std::vector<float> x = random_vector(static_cast<size_t>(n * stride), 11);
  // Segments [0, 3), [3, 3) (empty), [3, 4), [4, 7).
  const std::vector<int32_t> offsets = {0, 3, 3, 4, 7};
  std::vector<float> out(static_cast<size_t>(4 * cols), 0.0f);
  for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(cols + c)] = 5.0f;  // stays
  be.segment_sum({x.data(), n, cols, stride}, offsets, {out.data(), 4, cols, cols});
  for (int64_t s = 0; s < 4; ++s) {
    for (int64_t c = 0; c < cols; ++c) {
      float want = s == 1 ? 5.0f : 0.0f;  // the formula: from out's value, ascending rows
      for (int32_t r = offsets[static_cast<size_t>(s)]; r < offsets[static_cast<size_t>(s + 1)];
           ++r)
        want += x[static_cast<size_t>(r * stride + c)];
      EXPECT_EQ(out[static_cast<size_t>(s * cols + c)], want) << s << " " << c;
    }
  }
  // A sum continued over two calls equals one call over all its rows, bit for bit.
  std::vector<float> whole(static_cast<size_t>(cols), 0.0f), split(whole);
  const std::vector<int32_t> all = {0, 7}, first = {0, 4}, rest = {0, 3};
  be.segment_sum({x.data(), n, cols, stride}, all, {whole.data(), 1, cols, cols});
  be.segment_sum({x.data(), 4, cols, stride}, first, {split.data(), 1, cols, cols});
  be.segment_sum({x.data() + 4 * stride, 3, cols, stride}, rest, {split.data(), 1, cols, cols});
  EXPECT_EQ(whole, split);
  const std::vector<int32_t> backwards = {0, 4, 3, 7};
  EXPECT_EQ(error_of([&] {
              be.segment_sum({x.data(), n, cols, stride}, backwards, {out.data(), 3, cols, cols});
            }),
            "segment_sum: segment 1 ends at row 3 before it starts (4)");
  const std::vector<int32_t> short_cover = {0, 3, 6};
  EXPECT_EQ(error_of([&] {
              be.segment_sum({x.data(), n, cols, stride}, short_cover, {out.data(), 2, cols, cols});
            }),
            "segment_sum: the segments cover rows [0, 6); expected [0, 7)");
  EXPECT_NE(error_of([&] {
              be.segment_sum({x.data(), n, cols, stride}, offsets, {out.data(), 3, cols, cols});
            }).find("offsets: expected 4 values, found 5"),
            std::string::npos);
}

TEST(RowOps, RopeRowsEqualTheTableForEqualAxesAndFollowEachFrequencysAxis) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t half = 6;
  const std::vector<float> inv_freq = {1.0f, 0.5f, 0.25f, 0.1f, 0.05f, 0.01f};
  const std::vector<int32_t> axes = {0, 1, 2, 0, 1, 0};
  const std::vector<int32_t> pos = {3, 3, 3, 4, 9, 2};  // row 0: equal axes; row 1: a grid point
  std::vector<float> c(static_cast<size_t>(2 * half)), s(c.size());
  be.rope_rows({.positions = pos,
                .inv_freq = inv_freq.data(),
                .axes = axes.data(),
                .half = half,
                .scaling = 0.75f,
                .cos = {c.data(), 2, half, half},
                .sin = {s.data(), 2, half, half}});
  for (int64_t i = 0; i < half; ++i) {
    for (int64_t r = 0; r < 2; ++r) {
      const float freq =
          static_cast<float>(pos[static_cast<size_t>(3 * r + axes[static_cast<size_t>(i)])]) *
          inv_freq[static_cast<size_t>(i)];
      EXPECT_EQ(c[static_cast<size_t>(r * half + i)],
                static_cast<float>(std::cos(static_cast<double>(freq))) * 0.75f);
      EXPECT_EQ(s[static_cast<size_t>(r * half + i)],
                static_cast<float>(std::sin(static_cast<double>(freq))) * 0.75f);
    }
  }
}

}  // namespace
}  // namespace metrale
