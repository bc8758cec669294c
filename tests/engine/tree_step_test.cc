// Tree verification in one ragged step (engine/model.h StepItem::tree): every row of a draft tree
// gives, bit for bit, the logits its root-to-row path gives as a plain chain (the attention
// sees the context and the row's ancestors, stored where the step put them, at the positions a
// chain would give them), next to ordinary rows of other sequences in the same step; and
// compact() keeps one path so that decoding goes on exactly as after that chain. On dense, MoE,
// MLA and hybrid (Gated DeltaNet) families, a bf16 KV cache, and pages smaller than the tree.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "engine/model.h"
#include "fixture_util.h"

namespace metrale {
namespace {

struct Case {
  std::string fixture;
  DType kv_dtype = DType::kF32;
  int64_t page_size = 16;
};

std::string name_of(const Case& c) {
  std::string n = c.fixture + "_kv" + std::string(dtype_name(c.kv_dtype)) + "_page" +
                  std::to_string(c.page_size);
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

void PrintTo(const Case& c, std::ostream* os) { *os << name_of(c); }

class TreeStep : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    LoadOptions o;
    o.n_threads = 2;
    o.kv_tokens = 1024;
    o.kv_dtype = GetParam().kv_dtype;
    o.page_size = GetParam().page_size;
    m_ = Model::load(testing::fixture_dir(GetParam().fixture), o);
    V_ = static_cast<size_t>(m_->vocab_size());
    std::mt19937 rng(11);
    std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(V_) - 1);
    // 45 tokens: the tree's rows sit past a 32-key attention block boundary.
    for (int i = 0; i < 45; ++i) prompt_.push_back(tok(rng));
    for (size_t i = 0; i < kParents.size(); ++i) tokens_.push_back(tok(rng));
  }

  // The logits of the last row of `path` decoded as a chain after the prompt.
  std::vector<float> chain_logits(const std::vector<int32_t>& path) {
    Sequence seq;
    std::vector<float> last(V_);
    m_->prefill(seq, prompt_, last);
    std::vector<float> logits(path.size() * V_);
    const StepItem item{.seq = &seq, .ids = path, .logits = LogitRows::kAll};
    m_->step({&item, 1}, logits);
    m_->release(seq);
    return {logits.end() - static_cast<ptrdiff_t>(V_), logits.end()};
  }

  // Row j's path from the root: its tokens.
  std::vector<int32_t> path_of(size_t j) const {
    std::vector<int32_t> p;
    for (auto a = static_cast<int32_t>(j); a >= 0; a = kParents[static_cast<size_t>(a)])
      p.insert(p.begin(), tokens_[static_cast<size_t>(a)]);
    return p;
  }

  // Two children of the root, a deep first branch, siblings at several depths.
  static constexpr std::array<int32_t, 12> kParents = {-1, 0, 0, 1, 1, 2, 3, 6, 6, 5, 7, 9};
  std::unique_ptr<Model> m_;
  size_t V_ = 0;
  std::vector<int32_t> prompt_, tokens_;
};

TEST_P(TreeStep, EveryRowGivesItsPathsChainLogitsBitForBit) {
  Sequence seq, other;
  std::vector<float> last(V_);
  m_->prefill(seq, prompt_, last);
  const std::vector<int32_t> other_prompt(prompt_.begin(), prompt_.begin() + 20);
  m_->prefill(other, other_prompt, last);
  // The tree beside a plain decode row of another sequence, in one step.
  const std::vector<int32_t> other_ids = {tokens_[3]};
  const StepItem items[] = {
      {.seq = &other, .ids = other_ids, .logits = LogitRows::kLast},
      {.seq = &seq, .ids = tokens_, .logits = LogitRows::kAll, .tree = kParents}};
  std::vector<float> logits((1 + tokens_.size()) * V_);
  m_->step(items, logits);
  EXPECT_EQ(seq.tokens.size(), prompt_.size() + tokens_.size());
  for (size_t j = 0; j < tokens_.size(); ++j) {
    const std::vector<float> want = chain_logits(path_of(j));
    EXPECT_EQ(std::memcmp(want.data(), logits.data() + (1 + j) * V_, V_ * sizeof(float)), 0)
        << "tree row " << j << " (depth " << path_of(j).size() - 1 << ") differs from its chain";
  }
  // The plain row is the one it gives alone.
  Sequence alone;
  m_->prefill(alone, other_prompt, last);
  std::vector<float> plain(V_);
  m_->decode({std::array{&alone}.data(), 1}, other_ids, plain);
  EXPECT_EQ(std::memcmp(plain.data(), logits.data(), V_ * sizeof(float)), 0);
  m_->release(seq);
  m_->release(other);
  m_->release(alone);
}

TEST_P(TreeStep, CompactKeepsOnePathAndDecodingGoesOnAsAfterTheChain) {
  Sequence seq;
  std::vector<float> last(V_);
  m_->prefill(seq, prompt_, last);
  std::vector<float> logits(tokens_.size() * V_);
  const StepItem item{.seq = &seq, .ids = tokens_, .logits = LogitRows::kAll, .tree = kParents};
  m_->step({&item, 1}, logits);
  // Row 11's path: 0, 2, 5, 9, 11; keep the root (row 0) and rows 2, 5, 9.
  const auto start = static_cast<int64_t>(prompt_.size());
  const std::vector<int64_t> rows = {start + 2, start + 5, start + 9};
  m_->compact(seq, start + 1, rows);
  const std::vector<int32_t> path = {tokens_[0], tokens_[2], tokens_[5], tokens_[9]};
  std::vector<int32_t> want_tokens = prompt_;
  want_tokens.insert(want_tokens.end(), path.begin(), path.end());
  EXPECT_EQ(seq.tokens, want_tokens);
  // The next decode row equals the chain's.
  std::vector<int32_t> chain = path;
  chain.push_back(tokens_[11]);
  const std::vector<float> want = chain_logits(chain);
  std::vector<float> got(V_);
  m_->decode({std::array{&seq}.data(), 1}, std::vector<int32_t>{tokens_[11]}, got);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), V_ * sizeof(float)), 0);
  m_->release(seq);
  EXPECT_EQ(m_->kv_pool().free_pages(), m_->kv_pool().n_pages()) << "pages leaked";
}

TEST_P(TreeStep, MalformedTreesAreRefusedAndLeaveTheSequence) {
  Sequence seq;
  std::vector<float> last(V_);
  m_->prefill(seq, prompt_, last);
  std::vector<float> logits(3 * V_);
  const std::vector<int32_t> ids = {tokens_[0], tokens_[1], tokens_[2]};
  for (const std::vector<int32_t>& parents :
       {std::vector<int32_t>{0, 0, 1}, {-1, 1, 0}, {-1, 0, 3}, {-1, 0}}) {
    const StepItem item{.seq = &seq, .ids = ids, .logits = LogitRows::kAll, .tree = parents};
    EXPECT_THROW(m_->step({&item, 1}, logits), Error);
    EXPECT_EQ(seq.tokens.size(), prompt_.size());
  }
  const auto n = static_cast<int64_t>(seq.tokens.size());
  EXPECT_THROW(m_->compact(seq, n - 2, std::vector<int64_t>{n - 1, n - 1}), Error);
  EXPECT_THROW(m_->compact(seq, n - 2, std::vector<int64_t>{n}), Error);
  EXPECT_EQ(seq.tokens.size(), prompt_.size());
  m_->release(seq);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TreeStep,
                         ::testing::Values(Case{"llama_f32"}, Case{"qwen3_bf16", DType::kBF16, 4},
                                           Case{"qwen3_moe_bf16", DType::kF32, 8},
                                           Case{"deepseek_v3_bias_bf16"},
                                           Case{"deepseek_v3_bias_bf16", DType::kBF16, 4}),
                         [](const ::testing::TestParamInfo<Case>& p) { return name_of(p.param); });

// Hybrid models: each tree row's recurrent state continues from its parent's (every row's
// kept in the ring), so the rows equal their chains bit for bit here too, and compact() makes
// the path's last state the sequence's. A tree larger than the ring is refused.
class TreeStepHybrid : public ::testing::TestWithParam<std::string> {};

TEST_P(TreeStepHybrid, RowsEqualTheirChainsAndCompactKeepsThePathsState) {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 512;
  o.page_size = 8;
  const std::string fixture = GetParam().substr(0, GetParam().find('@'));
  if (GetParam().ends_with("@f16")) o.state_dtype = DType::kF16;  // states stored rounded
  auto m = Model::load(testing::fixture_dir(fixture), o);
  const auto V = static_cast<size_t>(m->vocab_size());
  const int64_t depth = m->state_pool()->plan().ring_depth;
  ASSERT_GE(depth, 6) << "the ring must hold the tree's rows";
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const std::vector<int32_t> ids = {21, 22, 23, 24, 25, 26, 27};
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 2, 5};
  const auto path_of = [&](size_t j) {
    std::vector<int32_t> p;
    for (auto a = static_cast<int32_t>(j); a >= 0; a = parents[static_cast<size_t>(a)])
      p.insert(p.begin(), ids[static_cast<size_t>(a)]);
    return p;
  };
  const auto chain = [&](const std::vector<int32_t>& path) {
    Sequence seq;
    std::vector<float> last(V), logits(path.size() * V);
    m->prefill(seq, prompt, last);
    const StepItem item{.seq = &seq, .ids = path, .logits = LogitRows::kAll};
    m->step({&item, 1}, logits);
    m->release(seq);
    return std::vector<float>(logits.end() - static_cast<ptrdiff_t>(V), logits.end());
  };
  Sequence seq;
  std::vector<float> last(V), logits(ids.size() * V);
  m->prefill(seq, prompt, last);
  const StepItem item{.seq = &seq, .ids = ids, .logits = LogitRows::kAll, .tree = parents};
  m->step({&item, 1}, logits);
  for (size_t j = 0; j < ids.size(); ++j) {
    const std::vector<float> want = chain(path_of(j));
    EXPECT_EQ(std::memcmp(want.data(), logits.data() + j * V, V * sizeof(float)), 0)
        << "tree row " << j;
  }
  // Row 6's path: 0, 2, 5, 6. A truncate into the tree is refused; compact keeps the path.
  const auto start = static_cast<int64_t>(prompt.size());
  EXPECT_THROW(m->truncate(seq, start + 2), Error);
  m->compact(seq, start + 1, std::vector<int64_t>{start + 2, start + 5, start + 6});
  std::vector<int32_t> next = path_of(6);
  next.push_back(31);
  const std::vector<float> want = chain(next);
  std::vector<float> got(V);
  m->decode({std::array{&seq}.data(), 1}, std::vector<int32_t>{31}, got);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), V * sizeof(float)), 0);
  // Compact needs a tree right before it.
  EXPECT_THROW(m->compact(seq, start + 2, std::vector<int64_t>{start + 4}), Error);
  // A tree past the ring.
  const std::vector<int32_t> wide_ids(static_cast<size_t>(depth + 2), 21);
  std::vector<int32_t> wide(wide_ids.size(), 0);
  wide[0] = -1;
  std::vector<float> wide_logits(wide_ids.size() * V);
  const StepItem too_big{.seq = &seq, .ids = wide_ids, .logits = LogitRows::kAll, .tree = wide};
  try {
    m->step({&too_big, 1}, wide_logits);
    FAIL() << "a tree larger than the ring ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state ring keeps"), std::string::npos) << e.what();
  }
  m->release(seq);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TreeStepHybrid,
                         ::testing::Values("qwen3_next_f32", "qwen3_next_f32@f16",
                                           "qwen3_5_text_bf16"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param;
                           for (char& c : n)
                             if (c == '@') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace metrale
