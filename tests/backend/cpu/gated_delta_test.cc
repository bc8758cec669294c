// Gated DeltaNet ops (causal_conv, delta_rule, sigmoid_mul, gated rms_norm) on every SIMD
// target against the scalar references, and the invariances the engine relies on: a ragged
// call equals each sequence alone, 1 thread equals 2 bit for bit, a state block may be both
// in and out, keeping every intermediate equals chaining one-row calls bit for bit, f16
// storage rounds as core/dtype does, and the chunked form equals the recurrent one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gated_delta.h"
#include "backend/cpu/reference.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

ConstRows slice(ConstRows r, int64_t begin, int64_t n) {
  return {r.data + begin * r.stride, n, r.n_cols, r.stride};
}
Rows slice(Rows r, int64_t begin, int64_t n) {
  return {r.data + begin * r.stride, n, r.n_cols, r.stride};
}

size_t elem_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// n state blocks of `state_elems` values at `offset` bytes, each followed by guard bytes that
// no op may touch.
class Blocks {
 public:
  static constexpr size_t kOffset = 128, kGuard = 64;
  Blocks(size_t n, size_t state_elems, DType dtype)
      : n_(n),
        dtype_(dtype),
        state_bytes_(state_elems * elem_bytes(dtype)),
        block_bytes_((kOffset + state_bytes_ + kGuard + 63) / 64 * 64),
        mem_(n * block_bytes_ + 64, std::byte{0x5A}) {
    const auto addr = reinterpret_cast<uintptr_t>(mem_.data());
    base_ = mem_.data() + (64 - addr % 64) % 64;
  }
  std::byte* block(size_t i) { return base_ + i * block_bytes_; }
  // Fills block i's state with values from `v` (stored in the dtype).
  void fill(size_t i, const std::vector<float>& v) {
    from_f32(v.data(), dtype_, block(i) + kOffset, v.size());
  }
  std::vector<float> read(size_t i) {
    std::vector<float> v(state_bytes_ / elem_bytes(dtype_));
    to_f32(block(i) + kOffset, dtype_, v.data(), v.size());
    return v;
  }
  std::vector<std::byte> raw(size_t i) {
    return {block(i) + kOffset, block(i) + kOffset + state_bytes_};
  }
  bool guards_intact() const {
    for (size_t i = 0; i < n_; ++i) {
      const std::byte* b = base_ + i * block_bytes_;
      for (size_t j = 0; j < kOffset; ++j)
        if (b[j] != std::byte{0x5A}) return false;
      for (size_t j = kOffset + state_bytes_; j < block_bytes_; ++j)
        if (b[j] != std::byte{0x5A}) return false;
    }
    return true;
  }
  DType dtype() const { return dtype_; }

 private:
  size_t n_;
  DType dtype_;
  size_t state_bytes_, block_bytes_;
  std::vector<std::byte> mem_;
  std::byte* base_ = nullptr;
};

// The StateRuns of one call: sequence s has lens[s] consecutive rows, starts from in[s] and
// keeps the state after its row i in out(s, i) (null: not kept; the last must be set).
struct Call {
  std::vector<int32_t> row_seq;
  std::vector<std::vector<std::byte*>> outs;
  std::vector<StateRun> runs;

  Call(const std::vector<int64_t>& lens, const std::vector<const std::byte*>& in,
       const std::function<std::byte*(size_t, int64_t)>& out) {
    outs.resize(lens.size());
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t i = 0; i < lens[s]; ++i) {
        row_seq.push_back(static_cast<int32_t>(s));
        outs[s].push_back(out(s, i));
      }
    }
    for (size_t s = 0; s < lens.size(); ++s) runs.push_back({.in = in[s], .out = outs[s]});
  }
  StateSlice slice(DType dtype) const {
    return {.runs = runs, .offset = Blocks::kOffset, .dtype = dtype};
  }
};

int64_t total(const std::vector<int64_t>& lens) {
  return std::accumulate(lens.begin(), lens.end(), int64_t{0});
}

void expect_close(const float* got, const float* want, size_t n, float atol, float rtol,
                  const char* what) {
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " at " << i;
  }
}

// ---------------------------------------------------------------- causal conv

struct ConvData {
  int64_t channels, kernel, n;
  std::vector<float> x, w;
  ConvData(int64_t c, int64_t k, int64_t rows, uint32_t seed)
      : channels(c),
        kernel(k),
        n(rows),
        x(testing::random_vector(static_cast<size_t>(rows * c), seed, -3.0f, 3.0f)),
        w(testing::random_vector(static_cast<size_t>(k * c), seed + 1)) {}
  CausalConvArgs args(Rows out, const Call& call, DType dtype, bool silu = true) const {
    return {.x = rows_of(x.data(), n, channels),
            .out = out,
            .weight = w.data(),
            .kernel = kernel,
            .silu = silu,
            .row_seq = call.row_seq,
            .state = call.slice(dtype)};
  }
};

TEST(CausalConv, MatchesReferenceOnEveryTarget) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const std::vector<int64_t> lens = {1, 5, 3};
  for (int64_t channels : {1, 7, 16, 33, 1100}) {
    for (int64_t kernel : {2, 4}) {
      for (DType dtype : {DType::kF32, DType::kF16}) {
        for (bool silu : {true, false}) {
          SCOPED_TRACE(::testing::Message() << "C=" << channels << " K=" << kernel
                                            << " dtype=" << dtype_name(dtype) << " silu=" << silu);
          const ConvData d(channels, kernel, total(lens), 10);
          const auto state_elems = static_cast<size_t>((kernel - 1) * channels);
          auto init = [&](size_t s) {
            return testing::random_vector(state_elems, 20 + static_cast<uint32_t>(s), -4, 4);
          };
          // Blocks 0..2: in; the rest: out (sequence 1 keeps rows 0 and 2 and its last).
          Blocks ref_blocks(3 + 9, state_elems, dtype);
          for (size_t s = 0; s < 3; ++s) ref_blocks.fill(s, init(s));
          auto out_block = [&](Blocks& b) {
            return [&b, &lens](size_t s, int64_t i) -> std::byte* {
              if (s == 1 && i != 0 && i != 2 && i != lens[1] - 1) return nullptr;
              size_t at = 3;
              for (size_t j = 0; j < s; ++j) at += static_cast<size_t>(lens[j]);
              return b.block(at + static_cast<size_t>(i));
            };
          };
          const Call ref_call(lens, {ref_blocks.block(0), ref_blocks.block(1), ref_blocks.block(2)},
                              out_block(ref_blocks));
          std::vector<float> want(d.x.size());
          cpu::reference::causal_conv(
              d.args(rows_of(want.data(), d.n, channels), ref_call, dtype, silu));
          testing::for_each_target([&] {
            Blocks blocks(3 + 9, state_elems, dtype);
            for (size_t s = 0; s < 3; ++s) blocks.fill(s, init(s));
            const Call call(lens, {blocks.block(0), blocks.block(1), blocks.block(2)},
                            out_block(blocks));
            std::vector<float> got(d.x.size());
            be.causal_conv(d.args(rows_of(got.data(), d.n, channels), call, dtype, silu));
            expect_close(got.data(), want.data(), got.size(), 1e-5f, 1e-5f, "out");
            for (size_t b = 0; b < 12; ++b) ASSERT_EQ(blocks.raw(b), ref_blocks.raw(b)) << b;
            EXPECT_TRUE(blocks.guards_intact());
          });
        }
      }
    }
  }
}

// f16 state storage rounds as core/dtype does (to nearest even; subnormals; overflow to
// inf), and f16 values read back and stored again are unchanged.
TEST(CausalConv, F16StateRoundsAsCore) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  const int64_t channels = 40, kernel = 3, n = 2;  // a whole vector and a tail
  ConvData d(channels, kernel, n, 130);
  const float specials[] = {
      3e-6f, -6e-8f, 70000.0f, 65520.0f, 65504.0f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
      -0.0f, 1e-9f};
  for (size_t i = 0; i < std::size(specials); ++i) d.x[i * 3] = specials[i];
  const auto state_elems = static_cast<size_t>((kernel - 1) * channels);
  const auto init = testing::random_vector(state_elems, 131, -4, 4);
  testing::for_each_target([&] {
    Blocks b(3, state_elems, DType::kF16);
    b.fill(0, init);
    const Call call({n}, {b.block(0)},
                    [&](size_t, int64_t i) { return b.block(1 + static_cast<size_t>(i)); });
    std::vector<float> out(static_cast<size_t>(n * channels));
    be.causal_conv(d.args(rows_of(out.data(), n, channels), call, DType::kF16));
    // After row 0 the state is [init row 1, x row 0]; after row 1, [x row 0, x row 1].
    std::vector<uint16_t> want(state_elems);
    std::vector<float> stream(b.read(0));
    stream.insert(stream.end(), d.x.begin(), d.x.end());
    for (int64_t i = 0; i < n; ++i) {
      from_f32(stream.data() + (i + 1) * channels, DType::kF16, want.data(), state_elems);
      std::vector<uint16_t> got(state_elems);
      std::memcpy(got.data(), b.block(1 + static_cast<size_t>(i)) + Blocks::kOffset,
                  state_elems * 2);
      ASSERT_EQ(got, want) << "row " << i;
    }
  });
}

// A ragged call == each sequence alone == one row at a time, bit for bit, on 1 or 2 threads,
// with the state updated in place (in == out).
TEST(CausalConv, RaggedAloneChainedInPlaceAndThreadsAgree) {
  ThreadPool pool1(1), pool2(2);
  CpuBackend be1(pool1), be2(pool2);
  const std::vector<int64_t> lens = {4, 1, 7};
  const int64_t channels = 1030, kernel = 4;
  const auto state_elems = static_cast<size_t>((kernel - 1) * channels);
  const ConvData d(channels, kernel, total(lens), 30);
  for (DType dtype : {DType::kF32, DType::kF16}) {
    auto fresh = [&] {
      auto b = std::make_unique<Blocks>(3, state_elems, dtype);
      for (size_t s = 0; s < 3; ++s)
        b->fill(s, testing::random_vector(state_elems, 40 + static_cast<uint32_t>(s)));
      return b;
    };
    // Ragged, in place, on each backend.
    std::vector<std::vector<float>> outs;
    std::vector<std::unique_ptr<Blocks>> states;
    for (CpuBackend* be : {&be1, &be2}) {
      auto b = fresh();
      const Call call(lens, {b->block(0), b->block(1), b->block(2)},
                      [&](size_t s, int64_t) { return b->block(s); });
      std::vector<float> out(d.x.size());
      be->causal_conv(d.args(rows_of(out.data(), d.n, channels), call, dtype));
      outs.push_back(out);
      states.push_back(std::move(b));
    }
    EXPECT_EQ(outs[0], outs[1]);
    // Each sequence alone, one row per call, in place.
    auto b = fresh();
    std::vector<float> chained(d.x.size());
    int64_t r0 = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t i = 0; i < lens[s]; ++i, ++r0) {
        const Call call({1}, {b->block(s)}, [&](size_t, int64_t) { return b->block(s); });
        CausalConvArgs a =
            d.args(rows_of(chained.data() + r0 * channels, 1, channels), call, dtype);
        a.x = slice(a.x, r0, 1);
        be2.causal_conv(a);
      }
    }
    EXPECT_EQ(chained, outs[0]);
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(b->raw(s), states[0]->raw(s));
      EXPECT_EQ(b->raw(s), states[1]->raw(s));
    }
  }
}

// ---------------------------------------------------------------- delta rule

struct DeltaShape {
  int64_t hk, hv, dk, dv;
};

// One call's inputs: q | k | v interleaved in one fused row (strided views, as the layer
// has them after the conv), a and b, the head parameters.
struct DeltaData {
  DeltaShape sh;
  int64_t n;
  std::vector<float> qkv, a, b, a_log, dt_bias;
  DeltaData(DeltaShape s, int64_t rows, uint32_t seed, float a_lo = 0.01f, float a_hi = 2.0f)
      : sh(s),
        n(rows),
        qkv(testing::random_vector(static_cast<size_t>(rows * width()), seed)),
        a(testing::random_vector(static_cast<size_t>(rows * s.hv), seed + 1, -3.0f, 3.0f)),
        b(testing::random_vector(static_cast<size_t>(rows * s.hv), seed + 2, -3.0f, 3.0f)),
        a_log(testing::random_vector(static_cast<size_t>(s.hv), seed + 3, a_lo, a_hi)),
        dt_bias(testing::random_vector(static_cast<size_t>(s.hv), seed + 4)) {
    for (float& x : a_log) x = std::log(x);
  }
  int64_t width() const { return 2 * sh.hk * sh.dk + sh.hv * sh.dv; }
  int64_t out_width() const { return sh.hv * sh.dv; }
  size_t state_elems() const { return static_cast<size_t>(sh.hv * sh.dk * sh.dv); }
  DeltaRuleArgs args(Rows out, const Call& call, DType dtype) const {
    const ConstRows all = rows_of(qkv.data(), n, width());
    return {.q = column_slice(all, 0, sh.hk * sh.dk),
            .k = column_slice(all, sh.hk * sh.dk, sh.hk * sh.dk),
            .v = column_slice(all, 2 * sh.hk * sh.dk, sh.hv * sh.dv),
            .a = rows_of(a.data(), n, sh.hv),
            .b = rows_of(b.data(), n, sh.hv),
            .a_log = a_log.data(),
            .dt_bias = dt_bias.data(),
            .n_k_heads = sh.hk,
            .n_v_heads = sh.hv,
            .k_head_dim = sh.dk,
            .v_head_dim = sh.dv,
            .out = out,
            .row_seq = call.row_seq,
            .state = call.slice(dtype)};
  }
  // Rows [r0, r0 + len) only (a sequence alone).
  DeltaRuleArgs rows(DeltaRuleArgs x, int64_t r0, int64_t len) const {
    x.q = slice(x.q, r0, len);
    x.k = slice(x.k, r0, len);
    x.v = slice(x.v, r0, len);
    x.a = slice(x.a, r0, len);
    x.b = slice(x.b, r0, len);
    x.out = slice(x.out, r0, len);
    return x;
  }
};

const DeltaShape kOdd{.hk = 2, .hv = 4, .dk = 16, .dv = 24};
const DeltaShape kReal{.hk = 16, .hv = 32, .dk = 128, .dv = 128};

void fill_states(Blocks& b, size_t n, size_t elems, uint32_t seed) {
  for (size_t i = 0; i < n; ++i)
    b.fill(i, testing::random_vector(elems, seed + static_cast<uint32_t>(i)));
}

TEST(DeltaRule, MatchesReferenceOnEveryTarget) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  for (const DeltaShape& sh : {kOdd, DeltaShape{.hk = 1, .hv = 1, .dk = 33, .dv = 70}, kReal}) {
    // Short runs (1, 3 and 4 rows, the middle one keeping every state) beside a long one
    // (40 rows, only the last kept); the real shape keeps it shorter.
    const std::vector<int64_t> lens =
        sh.dk == 128 ? std::vector<int64_t>{1, 3, 20} : std::vector<int64_t>{1, 3, 4, 40};
    const size_t n_seqs = lens.size();
    for (DType dtype : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(::testing::Message() << "dk=" << sh.dk << " dv=" << sh.dv << " hk=" << sh.hk
                                        << " hv=" << sh.hv << " dtype=" << dtype_name(dtype));
      const DeltaData d(sh, total(lens), 50);
      const size_t elems = d.state_elems();
      const size_t n_blocks = n_seqs + static_cast<size_t>(total(lens));
      auto out_block = [&](Blocks& b) {
        return [&b, &lens, n_seqs](size_t s, int64_t i) -> std::byte* {
          const bool keep = s == 1 || i == lens[s] - 1;
          size_t at = n_seqs;
          for (size_t j = 0; j < s; ++j) at += static_cast<size_t>(lens[j]);
          return keep ? b.block(at + static_cast<size_t>(i)) : nullptr;
        };
      };
      auto ins = [&](Blocks& b) {
        std::vector<const std::byte*> v;
        for (size_t s = 0; s < n_seqs; ++s) v.push_back(b.block(s));
        return v;
      };
      Blocks ref_blocks(n_blocks, elems, dtype);
      fill_states(ref_blocks, n_seqs, elems, 60);
      const Call ref_call(lens, ins(ref_blocks), out_block(ref_blocks));
      std::vector<float> want(static_cast<size_t>(d.n * d.out_width()));
      cpu::reference::delta_rule(d.args(rows_of(want.data(), d.n, d.out_width()), ref_call, dtype));
      testing::for_each_target([&] {
        Blocks blocks(n_blocks, elems, dtype);
        fill_states(blocks, n_seqs, elems, 60);
        const Call call(lens, ins(blocks), out_block(blocks));
        std::vector<float> got(want.size());
        be.delta_rule(d.args(rows_of(got.data(), d.n, d.out_width()), call, dtype));
        // f16 storage: the reference rounds the same kept states, but a value on a rounding
        // boundary may go either way; 2e-3 covers one f16 step of an O(1) state.
        const float tol = dtype == DType::kF16 ? 2e-3f : 2e-5f;
        expect_close(got.data(), want.data(), got.size(), tol, tol, "out");
        for (size_t i = n_seqs; i < n_blocks; ++i) {
          const auto g = blocks.read(i), w = ref_blocks.read(i);
          expect_close(g.data(), w.data(), g.size(), tol, tol, "state");
        }
        EXPECT_TRUE(blocks.guards_intact());
      });
    }
  }
}

// Run the four-way invariance: ragged == alone == one row at a time (every state kept), on
// 1 and 2 threads, bit for bit, and in place.
TEST(DeltaRule, RaggedAloneThreadsAndInPlaceAreBitIdentical) {
  ThreadPool pool1(1), pool2(2);
  CpuBackend be1(pool1), be2(pool2);
  for (const DeltaShape& sh : {kOdd, kReal}) {
    // A 70-row sequence among short ones (the chunked form's territory, were it enabled).
    const std::vector<int64_t> lens = {2, 70, 1, 5};
    const DeltaData d(sh, total(lens), 70);
    const size_t elems = d.state_elems();
    for (DType dtype : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(::testing::Message() << "dk=" << sh.dk << " dtype=" << dtype_name(dtype));
      auto fresh = [&] {
        auto b = std::make_unique<Blocks>(lens.size() * 2, elems, dtype);
        fill_states(*b, lens.size(), elems, 80);
        return b;
      };
      auto last_only = [&](Blocks& b) {
        return [&b, &lens](size_t s, int64_t i) -> std::byte* {
          return i == lens[s] - 1 ? b.block(lens.size() + s) : nullptr;
        };
      };
      std::vector<std::vector<float>> outs;
      std::vector<std::unique_ptr<Blocks>> states;
      for (CpuBackend* be : {&be1, &be2}) {
        auto b = fresh();
        const Call call(lens, {b->block(0), b->block(1), b->block(2), b->block(3)}, last_only(*b));
        std::vector<float> out(static_cast<size_t>(d.n * d.out_width()));
        be->delta_rule(d.args(rows_of(out.data(), d.n, d.out_width()), call, dtype));
        outs.push_back(std::move(out));
        states.push_back(std::move(b));
      }
      ASSERT_EQ(outs[0], outs[1]);
      for (size_t s = 0; s < lens.size() * 2; ++s) ASSERT_EQ(states[0]->raw(s), states[1]->raw(s));
      // Each sequence alone, in place (its out block is its in block).
      auto b = fresh();
      std::vector<float> alone(outs[0].size());
      int64_t r0 = 0;
      for (size_t s = 0; s < lens.size(); ++s) {
        const Call call({lens[s]}, {b->block(s)}, [&](size_t, int64_t i) -> std::byte* {
          return i == lens[s] - 1 ? b->block(s) : nullptr;
        });
        be2.delta_rule(
            d.rows(d.args(rows_of(alone.data(), d.n, d.out_width()), call, dtype), r0, lens[s]));
        EXPECT_EQ(b->raw(s), states[0]->raw(lens.size() + s)) << s;
        r0 += lens[s];
      }
      EXPECT_EQ(alone, outs[0]);
    }
  }
}

// Keeping every intermediate state == chaining one-row calls, bit for bit, f32 and f16.
TEST(DeltaRule, EveryStateKeptEqualsChainedSingleRows) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  for (const DeltaShape& sh : {kOdd, kReal}) {
    const int64_t n = 20;  // every state kept: the recurrent form, whatever the threshold
    const DeltaData d(sh, n, 90);
    const size_t elems = d.state_elems();
    for (DType dtype : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(::testing::Message() << "dk=" << sh.dk << " dtype=" << dtype_name(dtype));
      testing::for_each_target([&] {
        Blocks all(static_cast<size_t>(n) + 1, elems, dtype),
            one(static_cast<size_t>(n) + 1, elems, dtype);
        fill_states(all, 1, elems, 91);
        fill_states(one, 1, elems, 91);
        std::vector<float> out_all(static_cast<size_t>(n * d.out_width())), out_one(out_all.size());
        const Call call({n}, {all.block(0)},
                        [&](size_t, int64_t i) { return all.block(static_cast<size_t>(i) + 1); });
        be.delta_rule(d.args(rows_of(out_all.data(), n, d.out_width()), call, dtype));
        for (int64_t i = 0; i < n; ++i) {
          const Call c1({1}, {one.block(static_cast<size_t>(i))},
                        [&](size_t, int64_t) { return one.block(static_cast<size_t>(i) + 1); });
          be.delta_rule(d.rows(d.args(rows_of(out_one.data(), n, d.out_width()), c1, dtype), i, 1));
        }
        ASSERT_EQ(out_all, out_one);
        for (size_t i = 1; i <= static_cast<size_t>(n); ++i) ASSERT_EQ(all.raw(i), one.raw(i)) << i;
      });
    }
  }
}

// The chunked form equals the recurrent one within rounding, for runs of 1, 5, 64, 65, 130
// rows (chunk edges), with mild and strong decays.
TEST(DeltaRule, ChunkedMatchesRecurrent) {
  for (const DeltaShape& sh : {kOdd, kReal}) {
    for (int64_t n : {1, 5, 64, 65, 130}) {
      for (float a_hi : {0.05f, 8.0f}) {
        SCOPED_TRACE(::testing::Message() << "dk=" << sh.dk << " n=" << n << " a_hi=" << a_hi);
        const DeltaData d(sh, n, 100 + static_cast<uint32_t>(n), 0.01f, a_hi);
        const size_t elems = d.state_elems();
        // f16 storage on the odd shape only (the real shape's states are large).
        const DType dtype = sh.dk == 128 || n != 65 ? DType::kF32 : DType::kF16;
        const float tol = dtype == DType::kF32 ? 1e-4f : 2e-3f;
        testing::for_each_target([&] {
          Blocks blocks(3, elems, dtype);
          fill_states(blocks, 1, elems, 101);
          std::vector<float> out_rec(static_cast<size_t>(n * d.out_width())),
              out_chunk(out_rec.size());
          std::vector<float> scratch;
          for (int form = 0; form < 2; ++form) {
            const Call call({n}, {blocks.block(0)}, [&](size_t, int64_t i) -> std::byte* {
              return i == n - 1 ? blocks.block(1 + static_cast<size_t>(form)) : nullptr;
            });
            auto& out = form == 0 ? out_rec : out_chunk;
            const DeltaRuleArgs a = d.args(rows_of(out.data(), n, d.out_width()), call, dtype);
            scratch.assign(cpu::delta_rule_scratch_floats(a, true), 0.0f);
            const cpu::StateSpan span{.row_begin = 0, .run = &call.runs[0]};
            for (int64_t h = 0; h < sh.hv; ++h) {
              if (form == 0) {
                cpu::delta_rule_head_recurrent(a, span, h, scratch.data());
              } else {
                cpu::delta_rule_head_chunked(a, span, h, scratch.data());
              }
            }
          }
          expect_close(out_chunk.data(), out_rec.data(), out_rec.size(), tol, tol, "out");
          const auto s_rec = blocks.read(1), s_chunk = blocks.read(2);
          expect_close(s_chunk.data(), s_rec.data(), s_rec.size(), tol, tol, "state");
        });
      }
    }
  }
}

// The backend picks the chunked form only for runs past the threshold that keep only their
// last state (on the CPU the threshold is out of reach: see gated_delta.h).
TEST(DeltaRule, BackendPicksTheFormByRun) {
  EXPECT_EQ(cpu::kDeltaChunk, 64);
  std::byte dummy{};
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{600}}) {
    std::vector<std::byte*> outs(static_cast<size_t>(n), nullptr);
    outs.back() = &dummy;
    EXPECT_EQ(cpu::delta_rule_chunked({.in = &dummy, .out = outs}), n > cpu::kDeltaChunkMinRows);
    outs[0] = &dummy;
    EXPECT_FALSE(cpu::delta_rule_chunked({.in = &dummy, .out = outs}));
  }
}

// out may be v itself (the layer can run the rule in place of its v columns).
TEST(DeltaRule, OutMayAliasV) {
  ThreadPool pool(2);
  CpuBackend be(pool);
  for (int64_t n : {3, 40}) {
    DeltaData d(kOdd, n, 110);
    const size_t elems = d.state_elems();
    Blocks blocks(3, elems, DType::kF32);
    fill_states(blocks, 1, elems, 111);
    std::vector<float> out(static_cast<size_t>(n * d.out_width()));
    const Call c1({n}, {blocks.block(0)}, [&](size_t, int64_t i) -> std::byte* {
      return i == n - 1 ? blocks.block(1) : nullptr;
    });
    be.delta_rule(d.args(rows_of(out.data(), n, d.out_width()), c1, DType::kF32));
    const Call c2({n}, {blocks.block(0)}, [&](size_t, int64_t i) -> std::byte* {
      return i == n - 1 ? blocks.block(2) : nullptr;
    });
    DeltaRuleArgs a = d.args(Rows{}, c2, DType::kF32);
    a.out = {d.qkv.data() + 2 * kOdd.hk * kOdd.dk, n, d.out_width(), d.width()};
    be.delta_rule(a);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < d.out_width(); ++c)
        ASSERT_EQ(a.out.row(r)[c], out[static_cast<size_t>(r * d.out_width() + c)])
            << r << " " << c;
    EXPECT_EQ(blocks.raw(1), blocks.raw(2));
  }
}

// ---------------------------------------------------------------- gated norm, sigmoid_mul

TEST(GatedRmsNorm, MatchesReferenceOnEveryTarget) {
  for (int64_t n : {7, 16, 24, 33, 128}) {
    for (int64_t group : {int64_t{0}, n}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " group=" << group);
      const int64_t rows = 3, g = group > 0 ? group : n;
      const int64_t width = group > 0 ? 2 * n : n;  // per-group: two heads per row
      const size_t total_n = static_cast<size_t>(rows * width);
      const auto x = testing::random_vector(total_n, 1, -3.0f, 3.0f);
      const auto gate = testing::random_vector(total_n, 2, -12.0f, 12.0f);
      const auto w = testing::random_vector(static_cast<size_t>(g), 3);
      std::vector<float> want(total_n);
      const RmsNormArgs ra{.x = rows_of(x.data(), rows, width),
                           .out = rows_of(want.data(), rows, width),
                           .weight = w.data(),
                           .eps = 1e-6f,
                           .group = group,
                           .gate = rows_of(gate.data(), rows, width)};
      cpu::reference::rms_norm(ra);
      testing::for_each_target([&] {
        std::vector<float> got(total_n);
        RmsNormArgs a = ra;
        a.out = rows_of(got.data(), rows, width);
        cpu::rms_norm_rows(a, 0, rows);
        expect_close(got.data(), want.data(), total_n, 1e-6f, 4e-6f, "out");
      });
    }
  }
  ThreadPool pool(1);
  CpuBackend be(pool);
  std::vector<float> x(8), gate(8), w(4), out(8), h(8);
  RmsNormArgs bad{.x = rows_of(x.data(), 2, 4),
                  .residual = rows_of(h.data(), 2, 4),
                  .out = rows_of(out.data(), 2, 4),
                  .weight = w.data(),
                  .gate = rows_of(gate.data(), 2, 4)};
  EXPECT_THROW(be.rms_norm(bad), Error);
  bad.residual = Rows{};
  bad.gate = rows_of(gate.data(), 2, 3);
  EXPECT_THROW(be.rms_norm(bad), Error);
}

TEST(SigmoidMul, MatchesReferenceOnEveryTarget) {
  for (int64_t n : {1, 7, 16, 33, 100}) {
    for (bool per_row : {false, true}) {
      const int64_t rows = 3, gc = per_row ? 1 : n;
      auto y0 = testing::random_vector(static_cast<size_t>(rows * n), 4, -3.0f, 3.0f);
      auto gate = testing::random_vector(static_cast<size_t>(rows * gc), 5, -12.0f, 12.0f);
      gate[0] = -200.0f;  // far past exp's range: sigmoid is 0, as in torch
      std::vector<float> want = y0;
      cpu::reference::sigmoid_mul(
          {.gate = rows_of(gate.data(), rows, gc), .y = rows_of(want.data(), rows, n)});
      ThreadPool pool(2);
      CpuBackend be(pool);
      testing::for_each_target([&] {
        std::vector<float> got = y0;
        be.sigmoid_mul({.gate = rows_of(gate.data(), rows, gc), .y = rows_of(got.data(), rows, n)});
        expect_close(got.data(), want.data(), got.size(), 1e-7f, 4e-6f, "y");
        EXPECT_EQ(got[0], 0.0f * y0[0]);
      });
    }
  }
}

// ---------------------------------------------------------------- validation

TEST(GatedDeltaOps, RejectBadArguments) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  const std::vector<int64_t> lens = {2, 1};
  const DeltaData d(kOdd, 3, 120);
  Blocks blocks(4, d.state_elems(), DType::kF32);
  const Call call(lens, {blocks.block(0), blocks.block(1)},
                  [&](size_t s, int64_t) { return blocks.block(2 + s); });
  std::vector<float> out(static_cast<size_t>(3 * d.out_width()));
  const DeltaRuleArgs good = d.args(rows_of(out.data(), 3, d.out_width()), call, DType::kF32);
  EXPECT_NO_THROW(be.delta_rule(good));
  auto expect_error = [&](const DeltaRuleArgs& a, const char* needle) {
    try {
      be.delta_rule(a);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("delta_rule"), std::string::npos) << e.message();
    }
  };
  DeltaRuleArgs a = good;
  a.n_k_heads = 3;
  expect_error(a, "n_k_heads");
  a = good;
  a.a_log = nullptr;
  expect_error(a, "a_log");
  a = good;
  a.v.n_cols -= 1;
  expect_error(a, "v");
  a = good;
  a.out = rows_of(out.data(), 2, d.out_width());
  expect_error(a, "out");
  a = good;
  a.state.dtype = DType::kBF16;
  expect_error(a, "state.dtype");
  // row_seq: wrong length, a sequence outside the runs, a sequence split in two.
  std::vector<int32_t> rs = {0, 0};
  a = good;
  a.row_seq = rs;
  expect_error(a, "row_seq");
  rs = {0, 0, 2};
  a.row_seq = rs;
  expect_error(a, "state.runs");
  std::vector<std::byte*> o3 = {blocks.block(2), blocks.block(2)};
  std::vector<StateRun> split = {{.in = blocks.block(0), .out = std::span(o3).first(1)},
                                 {.in = blocks.block(1), .out = std::span(o3).first(1)}};
  rs = {0, 1, 0};
  a.row_seq = rs;
  a.state.runs = split;
  expect_error(a, "not consecutive");
  // A run whose out count does not match its rows, a null last out, a null in.
  rs = {0, 0, 1};
  a.row_seq = rs;
  std::vector<StateRun> runs = {{.in = blocks.block(0), .out = std::span(o3).first(1)},
                                {.in = blocks.block(1), .out = std::span(o3).first(1)}};
  a.state.runs = runs;
  expect_error(a, "state.runs[0].out");
  std::vector<std::byte*> last_null = {blocks.block(2), nullptr};
  runs[0].out = last_null;
  expect_error(a, "null");
  runs[0].out = std::span(o3);
  runs[0].in = nullptr;
  expect_error(a, "in is null");
  // A run with out blocks but no rows.
  runs[0].in = blocks.block(0);
  std::vector<StateRun> extra = {runs[0], runs[1], runs[1]};
  a.state.runs = extra;
  expect_error(a, "no rows");

  // causal_conv and sigmoid_mul.
  const ConvData cd(8, 4, 3, 121);
  Blocks cb(4, 24, DType::kF32);
  const Call cc(lens, {cb.block(0), cb.block(1)},
                [&](size_t s, int64_t) { return cb.block(2 + s); });
  std::vector<float> cout(24);
  const CausalConvArgs cgood = cd.args(rows_of(cout.data(), 3, 8), cc, DType::kF32);
  EXPECT_NO_THROW(be.causal_conv(cgood));
  CausalConvArgs ca = cgood;
  ca.kernel = 1;
  EXPECT_THROW(be.causal_conv(ca), Error);
  ca = cgood;
  ca.weight = nullptr;
  EXPECT_THROW(be.causal_conv(ca), Error);
  ca = cgood;
  ca.out = {const_cast<float*>(ca.x.data), 3, 8, 8};
  EXPECT_THROW(be.causal_conv(ca), Error);
  ca = cgood;
  ca.state.dtype = DType::kI8;
  EXPECT_THROW(be.causal_conv(ca), Error);
  std::vector<float> y(12), g(12);
  EXPECT_NO_THROW(be.sigmoid_mul({.gate = rows_of(g.data(), 3, 1), .y = rows_of(y.data(), 3, 4)}));
  EXPECT_THROW(be.sigmoid_mul({.gate = rows_of(g.data(), 3, 2), .y = rows_of(y.data(), 3, 4)}),
               Error);
  EXPECT_THROW(be.sigmoid_mul({.gate = rows_of(g.data(), 2, 4), .y = rows_of(y.data(), 3, 4)}),
               Error);
  EXPECT_TRUE(be.supports(Op::kDeltaRule, WeightFormat::kF32, DType::kF32));
  EXPECT_EQ(op_name(Op::kCausalConv), "causal_conv");
  EXPECT_EQ(op_name(Op::kDeltaRule), "delta_rule");
  EXPECT_EQ(op_name(Op::kSigmoidMul), "sigmoid_mul");
}

}  // namespace
}  // namespace metrale
