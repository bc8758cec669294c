// Multi-head latent attention in latent space (Backend::latent_attention) against a direct
// softmax over [latent | rope key] rows; a prefill stored and attended in chunks == in one
// call, bit for bit; its validation; and the interleaved-pairs rope against its formula.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/reference.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::random_vector;

constexpr int64_t kHeads = 3, kRank = 20, kRope = 6, kNope = 5, kPage = 4, kLen = 11;
constexpr int64_t kDim = kRank + kRope, kQk = kNope + kRope;

struct Latents {
  std::vector<float> kv = random_vector(kLen * kDim, 1, -1.5f, 1.5f);  // [len, R + rope]
  std::vector<float> q_latent = random_vector(kLen * kHeads * kRank, 2, -0.5f, 0.5f);
  std::vector<float> q = random_vector(kLen * kHeads * kQk, 3, -1.5f, 1.5f);
  std::vector<int32_t> blocks = {2, 0, 3};  // scrambled pages
  std::vector<float> pages = std::vector<float>(4 * kPage * kDim, NAN);
  KvLayout layout{
      .n_pages = 4, .page_size = kPage, .n_kv_heads = 1, .head_dim = kDim, .keys_only = true};

  // Rows [from, to) of the one sequence, stored and attended in one call.
  void run(Backend& be, int64_t from, int64_t to, std::vector<float>& out) {
    std::vector<int64_t> slots;
    std::vector<int32_t> pos, row_seq;
    const KvPageTable table{blocks, to};
    for (int64_t t = from; t < to; ++t) {
      slots.push_back(table.slot(t, kPage));
      pos.push_back(static_cast<int32_t>(t));
      row_seq.push_back(0);
    }
    const int64_t n = to - from;
    be.latent_attention(
        {.q_latent = rows_of(q_latent.data() + from * kHeads * kRank, n, kHeads * kRank),
         .q = rows_of(q.data() + from * kHeads * kQk, n, kHeads * kQk),
         .nope_dim = kNope,
         .kv = rows_of(kv.data() + from * kDim, n, kDim),
         .slots = slots,
         .out = rows_of(out.data() + from * kHeads * kRank, n, kHeads * kRank),
         .cache = {pages.data(), nullptr, layout},
         .seqs = std::span(&table, 1),
         .row_seq = row_seq,
         .positions = pos,
         .n_heads = kHeads,
         .kv_rank = kRank,
         .scale = 0.3f});
  }
};

TEST(LatentAttention, MatchesDirectSoftmaxOverLatents) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  Latents l;
  std::vector<float> out(static_cast<size_t>(kLen * kHeads * kRank));
  l.run(be, 0, kLen, out);
  for (int64_t r = 0; r < kLen; ++r) {
    for (int64_t h = 0; h < kHeads; ++h) {
      std::vector<double> s;
      double mx = -INFINITY;
      for (int64_t t = 0; t <= r; ++t) {
        double d = 0;
        for (int64_t i = 0; i < kRank; ++i)
          d += double{l.q_latent[static_cast<size_t>((r * kHeads + h) * kRank + i)]} *
               l.kv[static_cast<size_t>(t * kDim + i)];
        for (int64_t i = 0; i < kRope; ++i)
          d += double{l.q[static_cast<size_t>((r * kHeads + h) * kQk + kNope + i)]} *
               l.kv[static_cast<size_t>(t * kDim + kRank + i)];
        s.push_back(0.3 * d);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& v : s) sum += v = std::exp(v - mx);
      for (int64_t i = 0; i < kRank; ++i) {
        double want = 0;
        for (int64_t t = 0; t <= r; ++t)
          want += s[static_cast<size_t>(t)] / sum * l.kv[static_cast<size_t>(t * kDim + i)];
        EXPECT_NEAR(out[static_cast<size_t>((r * kHeads + h) * kRank + i)], want, 1e-5)
            << "row " << r << " head " << h << " dim " << i;
      }
    }
  }
}

TEST(LatentAttention, ChunkedEqualsOneCallOnAnyThreadCount) {
  ThreadPool two(2), three(3);
  CpuBackend a(two), b(three);
  Latents whole, chunked;
  std::vector<float> want(static_cast<size_t>(kLen * kHeads * kRank)), got(want.size());
  whole.run(a, 0, kLen, want);
  for (auto [from, to] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {4, 9}, {9, 11}})
    chunked.run(b, from, to, got);
  EXPECT_EQ(got, want);
}

TEST(LatentAttention, RejectsCachesWithValuesAndBadWidths) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  Latents l;
  std::vector<float> out(static_cast<size_t>(kLen * kHeads * kRank));
  l.layout.keys_only = false;
  EXPECT_THROW(l.run(be, 0, 2, out), Error);
  l.layout.keys_only = true;
  l.layout.head_dim = kRank;  // no room for the rope key
  EXPECT_THROW(l.run(be, 0, 2, out), Error);
}

TEST(Rope, InterleavedPairsRotateAdjacentValuesAfterTheOffset) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const int64_t half = 3, offset = 2, head = offset + 2 * half, n_pos = 5;
  const auto cos = random_vector(static_cast<size_t>(n_pos * half), 4);
  const auto sin = random_vector(cos.size(), 5);
  const RopeCache table{cos.data(), sin.data(), 2 * half, n_pos};
  const std::vector<int32_t> pos = {4, 1};
  const auto x = random_vector(static_cast<size_t>(2 * 2 * head), 6);
  testing::for_each_target([&] {
    std::vector<float> got = x, ref = x;
    for (std::vector<float>* v : {&got, &ref}) {
      const RopeArgs a{.x = rows_of(v->data(), 2, 2 * head),
                       .n_heads = 2,
                       .head_dim = head,
                       .positions = pos,
                       .table = table,
                       .offset = offset,
                       .pairs = true};
      if (v == &got)
        be.rope(a);
      else
        cpu::reference::rope(a);
    }
    EXPECT_EQ(got, ref);
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t h = 0; h < 2; ++h) {
        const float* in = x.data() + (r * 2 + h) * head;
        const float* o = got.data() + (r * 2 + h) * head;
        EXPECT_EQ(o[0], in[0]);  // before the offset: untouched
        for (int64_t i = 0; i < half; ++i) {
          const float c = cos[static_cast<size_t>(pos[static_cast<size_t>(r)] * half + i)];
          const float s = sin[static_cast<size_t>(pos[static_cast<size_t>(r)] * half + i)];
          const float x1 = in[offset + 2 * i], x2 = in[offset + 2 * i + 1];
          EXPECT_EQ(o[offset + 2 * i], x1 * c - x2 * s);
          EXPECT_EQ(o[offset + 2 * i + 1], x2 * c + x1 * s);
        }
      }
    }
  });
}

}  // namespace
}  // namespace metrale
