// The recurrent state of hybrid models (Gated DeltaNet layers) as the engine keeps it: one
// slot per sequence in the state pool, a ring of the states after recent tokens, rollback to
// any of them, and the errors a misuse gets. The parity of the numbers themselves is
// model_parity_test.cc; batch invariance is batch_invariance_test.cc (hybrid fixtures too).
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/model.h"
#include "fixture_util.h"

namespace metrale {
namespace {

using testing::max_abs_diff;
using testing::Reference;

constexpr const char* kFixture = "qwen3_next_f32";

std::unique_ptr<Model> load(LoadOptions o = {}) {
  o.n_threads = 2;
  o.kv_tokens = 512;
  return Model::load(testing::fixture_dir(kFixture), o);
}

// Logits after each of `tokens`, decoded one step at a time after `prompt`.
std::vector<float> decode_each(Model& m, Sequence& s, const std::vector<int32_t>& tokens) {
  const auto V = static_cast<size_t>(m.vocab_size());
  std::vector<float> scratch(V), out;
  for (int32_t t : tokens) {
    Sequence* p = &s;
    m.decode({&p, 1}, {&t, 1}, scratch);
    out.insert(out.end(), scratch.begin(), scratch.end());
  }
  return out;
}

std::vector<float> fresh(Model& m, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& tokens) {
  std::vector<float> scratch(static_cast<size_t>(m.vocab_size()));
  Sequence s;
  m.prefill(s, prompt, scratch);
  std::vector<float> out = decode_each(m, s, tokens);
  m.release(s);
  return out;
}

TEST(HybridState, ThePoolFollowsItsPlan) {
  auto m = load();
  const StatePool* pool = m->state_pool();
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->allocated_bytes(), pool->plan().total_bytes);
  EXPECT_EQ(pool->plan().slots, LoadOptions{}.max_seqs + 1);
  EXPECT_EQ(pool->plan().ring_depth, 8);  // no budget: the deepest rung
  int64_t with_state = 0;
  for (const DecoderLayer& layer : m->architecture().layers)
    with_state += layer.mixer().state_shape().empty() ? 0 : 1;
  EXPECT_EQ(with_state, pool->layout().n_state_layers());
}

// Decode k tokens one by one, roll back to j, continue: the same logits as decoding the j
// tokens and continuing, bit for bit, for every j the ring holds.
TEST(HybridState, DecodeRollbackThenContinueEqualsFresh) {
  const Reference ref(kFixture);
  const std::vector<int32_t> a = ref.ids("input_ids_b"), g = ref.ids("greedy_ids_b");
  auto m = load();
  const auto n = static_cast<int64_t>(a.size());
  const std::vector<int32_t> next = {g[5], g[6], g[7]};
  for (int64_t j : {0, 1, 3, 6}) {
    Sequence s;
    std::vector<float> scratch(static_cast<size_t>(m->vocab_size()));
    m->prefill(s, a, scratch);
    decode_each(*m, s, {g[0], g[1], 9, 10, 11, 12});  // k = 6 tokens, the last 6 - j rejected
    m->truncate(s, n + j);
    const std::vector<float> got = decode_each(*m, s, next);
    std::vector<int32_t> prefix = a, accepted = {g[0], g[1], 9, 10, 11, 12};
    prefix.insert(prefix.end(), accepted.begin(), accepted.begin() + j);
    EXPECT_EQ(got, fresh(*m, prefix, next)) << "rolled back to " << j << " of 6";
    m->release(s);
  }
}

// A verify step of k draft rows keeps the state after each row: roll back to any of them.
TEST(HybridState, VerifyRollbackThenContinueEqualsFresh) {
  const Reference ref(kFixture);
  const std::vector<int32_t> a = ref.ids("input_ids_b"), g = ref.ids("greedy_ids_b");
  auto m = load();
  const auto V = static_cast<size_t>(m->vocab_size());
  const std::vector<int32_t> draft = {g[0], g[1], g[2], 7, 8};
  for (int64_t j : {0, 2, 5}) {
    Sequence s;
    std::vector<float> scratch(V), verified(draft.size() * V);
    m->prefill(s, a, scratch);
    const StepItem verify{.seq = &s, .ids = draft, .logits = LogitRows::kAll};
    m->step({&verify, 1}, verified);
    m->truncate(s, static_cast<int64_t>(a.size()) + j);
    const std::vector<int32_t> next = {g[3], g[4]};
    std::vector<int32_t> prefix = a;
    prefix.insert(prefix.end(), draft.begin(), draft.begin() + j);
    EXPECT_EQ(decode_each(*m, s, next), fresh(*m, prefix, next)) << "accepted " << j;
    m->release(s);
  }
}

TEST(HybridState, RollbackPastTheRingIsRefused) {
  const Reference ref(kFixture);
  const std::vector<int32_t> a = ref.ids("input_ids_b");
  LoadOptions o;
  o.state_ring_depth = 2;
  auto m = load(o);
  EXPECT_EQ(m->state_pool()->plan().ring_depth, 2);
  Sequence s;
  std::vector<float> scratch(static_cast<size_t>(m->vocab_size()));
  m->prefill(s, a, scratch);  // 13 rows > depth 2: only the final state is kept
  const auto n = static_cast<int64_t>(a.size());
  EXPECT_EQ(s.state_floor, n);
  EXPECT_THROW(m->truncate(s, n - 1), Error);
  decode_each(*m, s, {3, 4, 5});
  EXPECT_EQ(s.state_floor, n + 1);
  EXPECT_THROW(m->truncate(s, n), Error);
  EXPECT_NO_THROW(m->truncate(s, n + 1));
  EXPECT_NO_THROW(m->truncate(s, 0));  // the empty state is always known
  EXPECT_EQ(decode_each(*m, s, {a[0]}), [&] {
    Sequence t;
    std::vector<float> one(static_cast<size_t>(m->vocab_size()));
    m->prefill(t, std::vector<int32_t>{a[0]}, one);
    m->release(t);
    return one;
  }());
  m->release(s);
}

TEST(HybridState, RingDepthZeroUpdatesInPlace) {
  const Reference ref(kFixture);
  const std::vector<int32_t> a = ref.ids("input_ids_b"), g = ref.ids("greedy_ids_b");
  LoadOptions o;
  o.state_ring_depth = 0;
  auto zero = load(o);
  auto deep = load();
  EXPECT_EQ(zero->state_pool()->plan().versions, 1);
  const std::vector<int32_t> next(g.begin(), g.begin() + 6);
  EXPECT_EQ(fresh(*zero, a, next), fresh(*deep, a, next));
}

TEST(HybridState, ACopiedSequenceCannotUseTheSameSlot) {
  const Reference ref(kFixture);
  const std::vector<int32_t> a = ref.ids("input_ids_b");
  auto m = load();
  Sequence s;
  std::vector<float> scratch(static_cast<size_t>(m->vocab_size()));
  m->prefill(s, a, scratch);
  Sequence copy = s;
  Sequence* p = &copy;
  const int32_t t = 5;
  try {
    m->decode({&p, 1}, {&t, 1}, scratch);
    ADD_FAILURE() << "a copied sequence decoded on its original's state slot";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state slot"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m->truncate(copy, 1), Error);
  m->release(s);
}

TEST(HybridState, AFullPoolIsAClearErrorAndChangesNothing) {
  const Reference ref(kFixture);
  const std::vector<int32_t> a = ref.ids("input_ids_b");
  LoadOptions o;
  o.max_seqs = 2;
  auto m = load(o);
  std::vector<float> scratch(static_cast<size_t>(m->vocab_size()));
  Sequence s1, s2, s3;
  m->prefill(s1, a, scratch);
  m->prefill(s2, a, scratch);
  try {
    m->prefill(s3, a, scratch);
    ADD_FAILURE() << "a third sequence got a state slot from a pool of 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("full"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(s3.tokens.empty());
  EXPECT_EQ(s3.state_slot, -1);
  m->release(s1);
  m->prefill(s3, a, scratch);  // the released slot serves the next sequence, zeroed
  std::vector<float> again(scratch.size());
  m->release(s2);
  m->prefill(s2, a, again);
  EXPECT_EQ(scratch, again);
  m->release(s2);
  m->release(s3);
}

TEST(HybridState, HalfPrecisionStorageStaysClose) {
  const Reference ref(kFixture);
  const std::vector<int32_t> a = ref.ids("input_ids"), g = ref.ids("greedy_ids");
  LoadOptions o;
  o.state_dtype = DType::kF16;
  auto half = load(o);
  auto full = load();
  EXPECT_EQ(half->state_pool()->layout().dtype, DType::kF16);
  EXPECT_LT(half->state_pool()->plan().block_bytes, full->state_pool()->plan().block_bytes);
  const std::vector<int32_t> next(g.begin(), g.begin() + 8);
  const std::vector<float> x = fresh(*half, a, next), y = fresh(*full, a, next);
  // f16 keeps ~11 bits of each state value; logits here are O(5).
  EXPECT_LT(max_abs_diff(x.data(), y.data(), x.size()), 5e-2f);
}

TEST(HybridState, ABudgetPicksTheDeepestRingThatFits) {
  auto probe = load();
  const uint64_t block = probe->state_pool()->plan().block_bytes;
  const auto slots = static_cast<uint64_t>(probe->state_pool()->plan().slots);
  LoadOptions o;
  o.state_budget = slots * 3 * block + block / 2;  // fits 3 versions (depth 2), not 5
  auto m = load(o);
  EXPECT_EQ(m->state_pool()->plan().ring_depth, 2);
  EXPECT_EQ(m->state_pool()->allocated_bytes(), slots * 3 * block);
  o.state_budget = slots * block - 1;  // not even depth 0
  EXPECT_THROW(load(o), Error);
}

// The chunked form of the delta rule (HF's prefill algorithm; off on the CPU, where it measured
// slower) run through a whole model: the prompt's logits within rounding of the recurrent
// form's, and HF's within the parity tolerance.
TEST(HybridState, ChunkedDeltaRuleMatchesRecurrentThroughTheModel) {
  const Reference ref(kFixture);
  const std::vector<int32_t> ids = ref.ids("input_ids");  // 80 tokens: two chunks of 64
  auto m = load();
  auto* cpu = dynamic_cast<CpuBackend*>(&m->backend());
  ASSERT_NE(cpu, nullptr);
  const auto V = static_cast<size_t>(m->vocab_size());
  auto prompt_logits = [&] {
    std::vector<float> logits(ids.size() * V);
    Sequence s;
    m->prefill(s, ids, logits, /*all_logits=*/true);
    m->release(s);
    return logits;
  };
  const std::vector<float> recurrent = prompt_logits();
  cpu->set_delta_chunk_min_rows(16);
  const std::vector<float> chunked = prompt_logits();
  EXPECT_NE(chunked, recurrent);  // the other form really ran
  // HF's own two forms differ by up to 1.0e-4 on these fixtures (tests/data/fixtures/README.md).
  EXPECT_LT(max_abs_diff(chunked.data(), recurrent.data(), chunked.size()), 1e-4f);
  const std::vector<float> want = ref.floats("logits");
  EXPECT_LT(max_abs_diff(chunked.data(), want.data(), want.size()), 5e-4f);
}

}  // namespace
}  // namespace metrale
