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
  std::vector<std::vector<int32_t>> blocks;          // per sequence
  std::vector<std::vector<float>> dense_k, dense_v;  // per sequence [len, n_kv, hd]
  std::vector<int64_t> lens;

  Fixture(Case cs, std::vector<int64_t> seq_lens, uint32_t seed)
      : c(cs), lens(std::move(seq_lens)) {
    int64_t pages = 0;
    for (int64_t len : lens) pages += (len + c.page_size - 1) / c.page_size;
    layout = {.n_pages = pages + 1,
              .page_size = c.page_size,
              .n_kv_heads = c.n_kv_heads,
              .head_dim = c.head_dim};
    k_pages.assign(static_cast<size_t>(layout.layer_elems()),
                   NAN);  // unwritten slots must never reach a result
    v_pages.assign(k_pages.size(), NAN);
    std::vector<int32_t> order(static_cast<size_t>(layout.n_pages));
    std::iota(order.begin(), order.end(), 0);
    std::reverse(order.begin(), order.end());
    std::rotate(order.begin(), order.begin() + 1, order.end());
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      std::vector<int32_t> bt;
      for (int64_t p = 0; p < (lens[s] + c.page_size - 1) / c.page_size; ++p)
        bt.push_back(order[next++]);
      blocks.push_back(bt);
      const auto n = static_cast<size_t>(lens[s] * layout.row_elems());
      dense_k.push_back(
          testing::random_vector(n, seed + 10 * static_cast<uint32_t>(s), -2.0f, 2.0f));
      dense_v.push_back(testing::random_vector(n, seed + 10 * static_cast<uint32_t>(s) + 1));
    }
  }
  KvLayerView view() { return {k_pages.data(), v_pages.data(), layout}; }
  KvPageTable table(size_t s, int64_t len) const { return {blocks[s], len}; }
  AttentionShape shape() const {
    return {.n_heads = c.n_heads,
            .n_kv_heads = c.n_kv_heads,
            .head_dim = c.head_dim,
            .sliding_window = c.window};
  }
  // Stores tokens [from, to) of sequence s through kv_store.
  void store(Backend& be, size_t s, int64_t from, int64_t to) {
    std::vector<int64_t> slots;
    for (int64_t t = from; t < to; ++t) slots.push_back(table(s, to).slot(t, c.page_size));
    const int64_t re = layout.row_elems();
    be.kv_store({.k = rows_of(dense_k[s].data() + from * re, to - from, re),
                 .v = rows_of(dense_v[s].data() + from * re, to - from, re),
                 .slots = slots,
                 .cache = view()});
  }
};

// Decode: row i is the newest token of tables[i].
void attend_decode(Backend& be, ConstRows q, Rows out, KvLayerView cache,
                   std::span<const KvPageTable> tables, AttentionShape shape) {
  std::vector<int32_t> row_seq, pos;
  for (size_t i = 0; i < tables.size(); ++i) {
    row_seq.push_back(static_cast<int32_t>(i));
    pos.push_back(static_cast<int32_t>(tables[i].seq_len - 1));
  }
  be.attention({.q = q,
                .out = out,
                .cache = cache,
                .seqs = tables,
                .row_seq = row_seq,
                .positions = pos,
                .shape = shape});
}

// Prefill: the rows are the newest q.n_rows tokens of `seq`.
void attend_prefill(Backend& be, ConstRows q, Rows out, KvLayerView cache, KvPageTable seq,
                    AttentionShape shape) {
  std::vector<int32_t> row_seq(static_cast<size_t>(q.n_rows), 0), pos;
  for (int64_t r = 0; r < q.n_rows; ++r)
    pos.push_back(static_cast<int32_t>(seq.seq_len - q.n_rows + r));
  be.attention({.q = q,
                .out = out,
                .cache = cache,
                .seqs = std::span(&seq, 1),
                .row_seq = row_seq,
                .positions = pos,
                .shape = shape});
}

const Case kCases[] = {
    {.n_heads = 4, .n_kv_heads = 4, .head_dim = 16, .page_size = 4, .window = 0},
    {.n_heads = 8, .n_kv_heads = 2, .head_dim = 32, .page_size = 16, .window = 0},  // GQA
    {.n_heads = 12,
     .n_kv_heads = 1,
     .head_dim = 20,
     .page_size = 3,
     .window = 0},  // MQA, >8 heads/group
    {.n_heads = 6,
     .n_kv_heads = 3,
     .head_dim = 17,
     .page_size = 5,
     .window = 7},  // window, odd dim
    {.n_heads = 2, .n_kv_heads = 1, .head_dim = 128, .page_size = 16, .window = 0},
    {.n_heads = 16, .n_kv_heads = 8, .head_dim = 128, .page_size = 16, .window = 0},  // Qwen3-0.6B
    {.n_heads = 8,
     .n_kv_heads = 2,
     .head_dim = 64,
     .page_size = 32,
     .window = 45},  // window over pages
};

TEST(Attention, DecodeMatchesDenseReferenceOnEveryTarget) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message()
                 << "heads=" << c.n_heads << "/" << c.n_kv_heads << " hd=" << c.head_dim
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
      cpu::reference::attention_row(q.data() + s * width, f.dense_k[s].data(), f.dense_v[s].data(),
                                    f.lens[s] - 1, sh, ref.data() + s * width);
    }
    testing::for_each_target([&] {
      testing::Floats out(ref.size(), 1);
      attend_decode(be, rows_of(q.data(), 3, width), rows_of(out.data(), 3, width), f.view(),
                    tables, f.shape());
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_NEAR(out[i], ref[i], 2e-6f + 2e-5f * std::abs(ref[i])) << i;
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
    attend_decode(many, rows_of(q.data(), n, width), rows_of(batch.data(), n, width), f.view(),
                  tables, f.shape());
    for (size_t s = 0; s < 4; ++s) {
      std::vector<float> alone(static_cast<size_t>(width));
      attend_decode(one, rows_of(q.data() + s * width, 1, width), rows_of(alone.data(), 1, width),
                    f.view(), std::span(tables).subspan(s, 1), f.shape());
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_EQ(testing::as_bits(alone[static_cast<size_t>(i)]),
                  testing::as_bits(batch[s * width + static_cast<size_t>(i)]))
            << "seq " << s << " i " << i;
      }
    }
  }
}

// Prefill of one sequence in chunks (storing each chunk first) equals one-piece prefill
// bit for bit, and both match the dense reference; the last row equals a decode step.
TEST(Attention, ChunkedPrefillEqualsOnePieceAndReference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message()
                 << "heads=" << c.n_heads << "/" << c.n_kv_heads << " hd=" << c.head_dim);
    ThreadPool pool(3);
    CpuBackend be(pool);
    const int64_t len = 77, width = c.n_heads * c.head_dim;
    Fixture f(c, {len}, 300);
    const auto q = testing::random_vector(static_cast<size_t>(len * width), 7, -2.0f, 2.0f);
    std::vector<float> whole(static_cast<size_t>(len * width)), chunked(whole.size());
    testing::for_each_target([&] {
      f.store(be, 0, 0, len);
      attend_prefill(be, rows_of(q.data(), len, width), rows_of(whole.data(), len, width), f.view(),
                     f.table(0, len), f.shape());
      int64_t done = 0;
      for (int64_t chunk : {1, 5, 11, 12, 48}) {
        f.store(be, 0, done, done + chunk);
        attend_prefill(be, rows_of(q.data() + done * width, chunk, width),
                       rows_of(chunked.data() + done * width, chunk, width), f.view(),
                       f.table(0, done + chunk), f.shape());
        done += chunk;
      }
      ASSERT_EQ(done, len);
      for (size_t i = 0; i < whole.size(); ++i)
        ASSERT_EQ(testing::as_bits(whole[i]), testing::as_bits(chunked[i])) << i;
      AttentionShape sh = f.shape();
      sh.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      std::vector<float> ref(static_cast<size_t>(width));
      for (int64_t t = 0; t < len; ++t) {
        cpu::reference::attention_row(q.data() + t * width, f.dense_k[0].data(),
                                      f.dense_v[0].data(), t, sh, ref.data());
        for (int64_t i = 0; i < width; ++i) {
          ASSERT_NEAR(whole[static_cast<size_t>(t * width + i)], ref[static_cast<size_t>(i)],
                      2e-6f + 2e-5f * std::abs(ref[static_cast<size_t>(i)]))
              << "t=" << t << " i=" << i;
        }
      }
      const KvPageTable last = f.table(0, len);
      std::vector<float> dec(static_cast<size_t>(width));
      attend_decode(be, rows_of(q.data() + (len - 1) * width, 1, width),
                    rows_of(dec.data(), 1, width), f.view(), std::span(&last, 1), f.shape());
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_EQ(testing::as_bits(dec[static_cast<size_t>(i)]),
                  testing::as_bits(whole[static_cast<size_t>((len - 1) * width + i)]));
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
      attend_prefill(be, rows_of(q.data(), len, width),
                     rows_of((f == &a ? out_a : out_b).data(), len, width), f->view(),
                     f->table(0, len), f->shape());
    }
    for (size_t i = 0; i < out_a.size(); ++i)
      ASSERT_EQ(testing::as_bits(out_a[i]), testing::as_bits(out_b[i])) << i;
  });
}

// One ragged call mixing a prefill chunk (sequence 0), decode rows (1, 2) and a 4-row
// verify (3) equals each part run alone, bit for bit; and the k verify rows equal k
// successive decode steps.
TEST(Attention, RaggedCallEqualsItsPartsAlone) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message()
                 << "heads=" << c.n_heads << "/" << c.n_kv_heads << " hd=" << c.head_dim);
    ThreadPool pool(3);
    CpuBackend be(pool);
    Fixture f(c, {40, 13, 1, 29}, 500);
    for (size_t s = 0; s < f.lens.size(); ++s) f.store(be, s, 0, f.lens[s]);
    const int64_t width = c.n_heads * c.head_dim;
    // Rows: 9 of seq 0 (its last 9), 1 of seq 1, 1 of seq 2, 4 of seq 3 (its last 4).
    const std::vector<int32_t> row_seq = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 3, 3, 3};
    std::vector<int32_t> pos;
    for (int32_t p = 31; p < 40; ++p) pos.push_back(p);
    pos.push_back(12);
    pos.push_back(0);
    for (int32_t p = 25; p < 29; ++p) pos.push_back(p);
    const auto n = static_cast<int64_t>(row_seq.size());
    std::vector<KvPageTable> tables;
    for (size_t s = 0; s < 4; ++s) tables.push_back(f.table(s, f.lens[s]));
    const auto q = testing::random_vector(static_cast<size_t>(n * width), 9, -2.0f, 2.0f);
    testing::for_each_target([&] {
      std::vector<float> mixed(static_cast<size_t>(n * width));
      be.attention({.q = rows_of(q.data(), n, width),
                    .out = rows_of(mixed.data(), n, width),
                    .cache = f.view(),
                    .seqs = tables,
                    .row_seq = row_seq,
                    .positions = pos,
                    .shape = f.shape()});
      for (int64_t r = 0; r < n; ++r) {
        // Row r alone, as a decode step of its sequence cut to its position.
        const size_t s = static_cast<size_t>(row_seq[static_cast<size_t>(r)]);
        const KvPageTable t = f.table(s, pos[static_cast<size_t>(r)] + 1);
        std::vector<float> alone(static_cast<size_t>(width));
        attend_decode(be, rows_of(q.data() + r * width, 1, width), rows_of(alone.data(), 1, width),
                      f.view(), std::span(&t, 1), f.shape());
        for (int64_t i = 0; i < width; ++i) {
          ASSERT_EQ(testing::as_bits(alone[static_cast<size_t>(i)]),
                    testing::as_bits(mixed[static_cast<size_t>(r * width + i)]))
              << "row " << r << " i " << i;
        }
      }
    });
  }
}

TEST(Attention, RejectsRowsOutsideTheirSequence) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  Fixture f({.n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .page_size = 4, .window = 0}, {6}, 1);
  std::vector<float> q(16), out(16);
  const KvPageTable t = f.table(0, 6);
  const std::vector<int32_t> seq0 = {0}, seq1 = {1}, pos5 = {5}, pos6 = {6};
  auto call = [&](const std::vector<int32_t>& rs, const std::vector<int32_t>& ps) {
    be.attention({.q = rows_of(q.data(), 1, 16),
                  .out = rows_of(out.data(), 1, 16),
                  .cache = f.view(),
                  .seqs = std::span(&t, 1),
                  .row_seq = rs,
                  .positions = ps,
                  .shape = f.shape()});
  };
  EXPECT_NO_THROW(call(seq0, pos5));
  EXPECT_THROW(call(seq0, pos6), Error);  // key 6 is not stored
  EXPECT_THROW(call(seq1, pos5), Error);  // no sequence 1
}

TEST(Attention, RejectsBadBlockTablesAndShapes) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  Fixture f({.n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .page_size = 4, .window = 0}, {6}, 1);
  std::vector<float> q(16), out(16);
  const std::vector<int32_t> short_table = {0};
  const KvPageTable too_short{short_table, 6};
  EXPECT_THROW(attend_decode(be, rows_of(q.data(), 1, 16), rows_of(out.data(), 1, 16), f.view(),
                             std::span(&too_short, 1), f.shape()),
               Error);
  const std::vector<int32_t> bad_page = {0, 99};
  const KvPageTable out_of_range{bad_page, 6};
  EXPECT_THROW(attend_decode(be, rows_of(q.data(), 1, 16), rows_of(out.data(), 1, 16), f.view(),
                             std::span(&out_of_range, 1), f.shape()),
               Error);
  AttentionShape wrong = f.shape();
  wrong.n_kv_heads = 2;
  const KvPageTable ok = f.table(0, 6);
  EXPECT_THROW(attend_decode(be, rows_of(q.data(), 1, 16), rows_of(out.data(), 1, 16), f.view(),
                             std::span(&ok, 1), wrong),
               Error);
  const std::vector<int64_t> slots = {f.layout.n_slots()};
  EXPECT_THROW(be.kv_store({.k = rows_of(q.data(), 1, 8),
                            .v = rows_of(q.data(), 1, 8),
                            .slots = slots,
                            .cache = f.view()}),
               Error);
}

}  // namespace
}  // namespace metrale
