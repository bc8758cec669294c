// Paged attention: decode against a naive dense attention, prefill in chunks == prefill in
// one piece, a sequence decoded alone == the same sequence co-batched, GQA and sliding
// windows, on every SIMD target; plus kv_store and the validation of block tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/reference.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

struct Case {
  int64_t n_heads, n_kv_heads, head_dim, page_size, window;
};

// A cache with pages handed out in a scrambled order, plus each sequence's dense K/V.
struct Fixture {
  Case c;
  KvLayout layout;
  std::vector<float> k_pages, v_pages;
  std::vector<std::vector<int32_t>> blocks;   // per sequence
  std::vector<std::vector<float>> dense_k, dense_v;  // per sequence [len, n_kv, hd]
  std::vector<int64_t> lens;

  Fixture(Case cs, std::vector<int64_t> seq_lens, uint32_t seed) : c(cs), lens(std::move(seq_lens)) {
    int64_t pages = 0;
    for (int64_t len : lens) pages += (len + c.page_size - 1) / c.page_size;
    layout = {.n_pages = pages + 1, .page_size = c.page_size, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim};
    k_pages.assign(static_cast<size_t>(layout.layer_elems()), NAN);  // unwritten slots must never reach a result
    v_pages.assign(k_pages.size(), NAN);
    std::vector<int32_t> order(static_cast<size_t>(layout.n_pages));
    std::iota(order.begin(), order.end(), 0);
    std::reverse(order.begin(), order.end());
    std::rotate(order.begin(), order.begin() + 1, order.end());
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      std::vector<int32_t> bt;
      for (int64_t p = 0; p < (lens[s] + c.page_size - 1) / c.page_size; ++p) bt.push_back(order[next++]);
      blocks.push_back(bt);
      const auto n = static_cast<size_t>(lens[s] * layout.row_elems());
      dense_k.push_back(testing::random_vector(n, seed + 10 * static_cast<uint32_t>(s), -2.0f, 2.0f));
      dense_v.push_back(testing::random_vector(n, seed + 10 * static_cast<uint32_t>(s) + 1));
    }
  }
  KvLayerView view() { return {k_pages.data(), v_pages.data(), layout}; }
  KvPageTable table(size_t s, int64_t len) const { return {blocks[s], len}; }
  AttentionShape shape() const {
    return {.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .sliding_window = c.window};
  }
  // Stores tokens [from, to) of sequence s through kv_store.
  void store(Backend& be, size_t s, int64_t from, int64_t to) {
    std::vector<int64_t> slots;
    for (int64_t t = from; t < to; ++t) slots.push_back(table(s, to).slot(t, c.page_size));
    const int64_t re = layout.row_elems();
    be.kv_store({.k = rows_of(dense_k[s].data() + from * re, to - from, re),
                 .v = rows_of(dense_v[s].data() + from * re, to - from, re), .slots = slots, .cache = view()});
  }
};

const Case kCases[] = {
    {.n_heads = 4, .n_kv_heads = 4, .head_dim = 16, .page_size = 4, .window = 0},
    {.n_heads = 8, .n_kv_heads = 2, .head_dim = 32, .page_size = 16, .window = 0},   // GQA
    {.n_heads = 12, .n_kv_heads = 1, .head_dim = 20, .page_size = 3, .window = 0},   // MQA, >8 heads/group
    {.n_heads = 6, .n_kv_heads = 3, .head_dim = 17, .page_size = 5, .window = 7},    // window, odd dim
    {.n_heads = 2, .n_kv_heads = 1, .head_dim = 128, .page_size = 16, .window = 0},
    {.n_heads = 16, .n_kv_heads = 8, .head_dim = 128, .page_size = 16, .window = 0},  // Qwen3-0.6B
    {.n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .page_size = 32, .window = 45},   // window over pages
};

TEST(Attention, DecodeMatchesDenseReferenceOnEveryTarget) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "heads=" << c.n_heads << "/" << c.n_kv_heads << " hd=" << c.head_dim
                                      << " page=" << c.page_size << " window=" << c.window);
    ThreadPool pool(3);
    CpuBackend be(pool);
    Fixture f(c, {1, 13, 70}, 100);
    for (size_t s = 0; s < f.lens.size(); ++s) f.store(be, s, 0, f.lens[s]);
    const int64_t width = c.n_heads * c.head_dim;
    const auto q = testing::random_vector(static_cast<size_t>(3 * width), 5, -2.0f, 2.0f);
    std::vector<KvPageTable> tables;
    for (size_t s = 0; s < 3; ++s) tables.push_back(f.table(s, f.lens[s]));
    AttentionShape sh = f.shape();
    sh.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> ref(static_cast<size_t>(3 * width));
    for (size_t s = 0; s < 3; ++s) {
      cpu::reference::attention_row(q.data() + s * width, f.dense_k[s].data(), f.dense_v[s].data(), f.lens[s] - 1, sh,
                                    ref.data() + s * width);
    }
    testing::for_each_target([&] {
      testing::Floats out(ref.size(), 1);
      be.attention_decode({.q = rows_of(q.data(), 3, width), .out = rows_of(out.data(), 3, width), .cache = f.view(),
                           .seqs = tables, .shape = f.shape()});
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-6f + 2e-5f * std::abs(ref[i])) << i;
    });
  }
}

TEST(Attention, CoBatchedDecodeEqualsAlone) {
  for (const Case& c : kCases) {
    ThreadPool pool4(4), pool1(1);
    CpuBackend many(pool4), one(pool1);
    Fixture f(c, {9, 40, 2, 33}, 200);
    for (size_t s = 0; s < f.lens.size(); ++s) f.store(many, s, 0, f.lens[s]);
    const int64_t width = c.n_heads * c.head_dim, n = 4;
    const auto q = testing::random_vector(static_cast<size_t>(n * width), 6);
    std::vector<KvPageTable> tables;
    for (size_t s = 0; s < 4; ++s) tables.push_back(f.table(s, f.lens[s]));
    std::vector<float> batch(static_cast<size_t>(n * width));
    many.attention_decode({.q = rows_of(q.data(), n, width), .out = rows_of(batch.data(), n, width),
                           .cache = f.view(), .seqs = tables, .shape = f.shape()});
    for (size_t s = 0; s < 4; ++s) {
      std::vector<float> alone(static_cast<size_t>(width));
      one.attention_decode({.q = rows_of(q.data() + s * width, 1, width), .out = rows_of(alone.data(), 1, width),
                            .cache = f.view(), .seqs = std::span(tables).subspan(s, 1), .shape = f.shape()});
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_EQ(testing::as_bits(alone[static_cast<size_t>(i)]), testing::as_bits(batch[s * width + static_cast<size_t>(i)]))
            << "seq " << s << " i " << i;
      }
    }
  }
}

// Prefill of one sequence in chunks (storing each chunk first) equals one-piece prefill
// bit for bit, and both match the dense reference; the last row equals a decode step.
TEST(Attention, ChunkedPrefillEqualsOnePieceAndReference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "heads=" << c.n_heads << "/" << c.n_kv_heads << " hd=" << c.head_dim);
    ThreadPool pool(3);
    CpuBackend be(pool);
    const int64_t len = 77, width = c.n_heads * c.head_dim;
    Fixture f(c, {len}, 300);
    const auto q = testing::random_vector(static_cast<size_t>(len * width), 7, -2.0f, 2.0f);
    std::vector<float> whole(static_cast<size_t>(len * width)), chunked(whole.size());
    testing::for_each_target([&] {
      f.store(be, 0, 0, len);
      be.attention_prefill({.q = rows_of(q.data(), len, width), .out = rows_of(whole.data(), len, width),
                            .cache = f.view(), .seq = f.table(0, len), .shape = f.shape()});
      int64_t done = 0;
      for (int64_t chunk : {1, 5, 11, 12, 48}) {
        f.store(be, 0, done, done + chunk);
        be.attention_prefill({.q = rows_of(q.data() + done * width, chunk, width),
                              .out = rows_of(chunked.data() + done * width, chunk, width), .cache = f.view(),
                              .seq = f.table(0, done + chunk), .shape = f.shape()});
        done += chunk;
      }
      ASSERT_EQ(done, len);
      for (size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(testing::as_bits(whole[i]), testing::as_bits(chunked[i])) << i;
      AttentionShape sh = f.shape();
      sh.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      std::vector<float> ref(static_cast<size_t>(width));
      for (int64_t t = 0; t < len; ++t) {
        cpu::reference::attention_row(q.data() + t * width, f.dense_k[0].data(), f.dense_v[0].data(), t, sh, ref.data());
        for (int64_t i = 0; i < width; ++i) {
          ASSERT_NEAR(whole[static_cast<size_t>(t * width + i)], ref[static_cast<size_t>(i)],
                      2e-6f + 2e-5f * std::abs(ref[static_cast<size_t>(i)]))
              << "t=" << t << " i=" << i;
        }
      }
      const KvPageTable last = f.table(0, len);
      std::vector<float> dec(static_cast<size_t>(width));
      be.attention_decode({.q = rows_of(q.data() + (len - 1) * width, 1, width), .out = rows_of(dec.data(), 1, width),
                           .cache = f.view(), .seqs = std::span(&last, 1), .shape = f.shape()});
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_EQ(testing::as_bits(dec[static_cast<size_t>(i)]), testing::as_bits(whole[static_cast<size_t>((len - 1) * width + i)]));
      }
    });
  }
}

// Keys read in place from pages that hold whole vectors of them (page_size 16) and keys
// gathered from pages that do not (page_size 5) give the same bits.
TEST(Attention, PageSizeDoesNotChangeResults) {
  const Case in_place{.n_heads = 8, .n_kv_heads = 2, .head_dim = 24, .page_size = 16, .window = 0};
  Case gathered = in_place;
  gathered.page_size = 5;
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t len = 70, width = in_place.n_heads * in_place.head_dim;
  Fixture a(in_place, {len}, 400), b(gathered, {len}, 400);
  const auto q = testing::random_vector(static_cast<size_t>(len * width), 8, -2.0f, 2.0f);
  testing::for_each_target([&] {
    std::vector<float> out_a(static_cast<size_t>(len * width)), out_b(out_a.size());
    for (Fixture* f : {&a, &b}) {
      f->store(be, 0, 0, len);
      be.attention_prefill({.q = rows_of(q.data(), len, width),
                            .out = rows_of((f == &a ? out_a : out_b).data(), len, width), .cache = f->view(),
                            .seq = f->table(0, len), .shape = f->shape()});
    }
    for (size_t i = 0; i < out_a.size(); ++i) ASSERT_EQ(testing::as_bits(out_a[i]), testing::as_bits(out_b[i])) << i;
  });
}

TEST(Attention, RejectsBadBlockTablesAndShapes) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  Fixture f({.n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .page_size = 4, .window = 0}, {6}, 1);
  std::vector<float> q(16), out(16);
  const std::vector<int32_t> short_table = {0};
  const KvPageTable too_short{short_table, 6};
  EXPECT_THROW(be.attention_decode({.q = rows_of(q.data(), 1, 16), .out = rows_of(out.data(), 1, 16), .cache = f.view(),
                                    .seqs = std::span(&too_short, 1), .shape = f.shape()}),
               Error);
  const std::vector<int32_t> bad_page = {0, 99};
  const KvPageTable out_of_range{bad_page, 6};
  EXPECT_THROW(be.attention_decode({.q = rows_of(q.data(), 1, 16), .out = rows_of(out.data(), 1, 16), .cache = f.view(),
                                    .seqs = std::span(&out_of_range, 1), .shape = f.shape()}),
               Error);
  AttentionShape wrong = f.shape();
  wrong.n_kv_heads = 2;
  const KvPageTable ok = f.table(0, 6);
  EXPECT_THROW(be.attention_decode({.q = rows_of(q.data(), 1, 16), .out = rows_of(out.data(), 1, 16), .cache = f.view(),
                                    .seqs = std::span(&ok, 1), .shape = wrong}),
               Error);
  const std::vector<int64_t> slots = {f.layout.n_slots()};
  EXPECT_THROW(be.kv_store({.k = rows_of(q.data(), 1, 8), .v = rows_of(q.data(), 1, 8), .slots = slots, .cache = f.view()}),
               Error);
}

}  // namespace
}  // namespace metrale
