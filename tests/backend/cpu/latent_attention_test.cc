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

// A ragged pass over two sequences whose pages are scrambled, with the kernel's items run on
// every compiled target against the scalar reference: odd head counts (one short vector, more
// than a head group), ranks that are not whole dim tiles, pages that are not whole key tiles.
struct RaggedCase {
  int64_t heads, rank, rope, nope, page;
};

void expect_items_match_reference(const RaggedCase& c) {
  const int64_t dim = c.rank + c.rope, qk = c.nope + c.rope;
  const std::vector<int64_t> lens = {3 * c.page + 5, 2 * c.page - 1};
  int64_t pages = 0;
  for (int64_t len : lens) pages += (len + c.page - 1) / c.page;
  std::vector<float> cache =
      random_vector(static_cast<size_t>(pages * c.page * dim), 11, -1.5f, 1.5f);
  std::vector<std::vector<int32_t>> blocks(lens.size());
  int32_t next = static_cast<int32_t>(pages) - 1;  // pages handed out backwards
  for (size_t s = 0; s < lens.size(); ++s)
    for (int64_t p = 0; p < (lens[s] + c.page - 1) / c.page; ++p) blocks[s].push_back(next--);
  const std::vector<KvPageTable> tables = {{blocks[0], lens[0]}, {blocks[1], lens[1]}};
  // Rows: a decode of each sequence, then a chunk of the first one's prefill.
  std::vector<int32_t> row_seq = {0, 1},
                       pos = {static_cast<int32_t>(lens[0] - 1), static_cast<int32_t>(lens[1] - 1)};
  for (int32_t p = 0; p < static_cast<int32_t>(c.page) + 3; ++p) {
    row_seq.push_back(0);
    pos.push_back(p);
  }
  const auto n = static_cast<int64_t>(pos.size());
  const auto q_latent = random_vector(static_cast<size_t>(n * c.heads * c.rank), 12, -0.5f, 0.5f);
  const auto q = random_vector(static_cast<size_t>(n * c.heads * qk), 13, -1.5f, 1.5f);
  std::vector<float> want(static_cast<size_t>(n * c.heads * c.rank)), got(want.size());
  LatentAttentionArgs a{.q_latent = rows_of(q_latent.data(), n, c.heads * c.rank),
                        .q = rows_of(q.data(), n, c.heads * qk),
                        .nope_dim = c.nope,
                        .out = rows_of(want.data(), n, c.heads * c.rank),
                        .cache = {cache.data(), nullptr,
                                  KvLayout{.n_pages = pages,
                                           .page_size = c.page,
                                           .n_kv_heads = 1,
                                           .head_dim = dim,
                                           .keys_only = true}},
                        .seqs = tables,
                        .row_seq = row_seq,
                        .positions = pos,
                        .n_heads = c.heads,
                        .kv_rank = c.rank,
                        .scale = 0.3f};
  cpu::reference::latent_attention(a);
  a.out = rows_of(got.data(), n, c.heads * c.rank);
  const int64_t groups = (c.heads + cpu::kLatentHeadGroup - 1) / cpu::kLatentHeadGroup;
  std::vector<float> scratch(cpu::latent_attention_scratch_floats(dim, pages * c.page));
  testing::for_each_target([&] {
    std::fill(got.begin(), got.end(), NAN);
    // Items one at a time, in reverse: an item's result must not depend on the others.
    for (int64_t item = n * groups - 1; item >= 0; --item)
      cpu::latent_attention_items(a, item, item + 1, scratch.data());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-6 + 2e-6 * std::abs(want[i]))
          << "heads " << c.heads << " rank " << c.rank << " page " << c.page << " at " << i;
  });
}

TEST(LatentAttention, KernelMatchesReferenceOnEveryTarget) {
  for (const RaggedCase& c :
       {RaggedCase{3, 20, 6, 5, 4}, RaggedCase{16, 64, 16, 8, 16}, RaggedCase{17, 37, 8, 3, 5},
        RaggedCase{35, 52, 12, 4, 32}, RaggedCase{1, 1, 1, 1, 1}})
    expect_items_match_reference(c);
}

TEST(LatentAttention, OneThreadEqualsThreeBitForBit) {
  ThreadPool one(1), three(3);
  CpuBackend a(one), b(three);
  Latents x, y;
  std::vector<float> want(static_cast<size_t>(kLen * kHeads * kRank)), got(want.size());
  x.run(a, 0, kLen, want);
  y.run(b, 0, kLen, got);
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
