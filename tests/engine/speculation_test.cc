// Speculative decoding through the engine (engine/speculation.h): the output is the same with
// and without n-gram drafts — greedy token for token on every family, weight format, compute
// mode and with a LoRA adapter; sampled, for a seed, as well — the drafts the engine accepts
// are exactly the ones an oracle walking the plain output accepts, rejected rows give their KV
// pages back, hybrid models roll their recurrent state back through the ring (and draft no
// more than it holds), and a proposer that reads the target's hidden states is handed the
// target's exact rows. The distribution test of the sampled verify is
// tests/speculative/verify_test.cc.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "engine/mtp_proposer.h"
#include "engine/session.h"
#include "fixture_util.h"
#include "speculative/ngram_proposer.h"

namespace metrale {
namespace {

using speculative::NgramProposer;

std::string fixture_of(const std::string& param) { return param.substr(0, param.find('@')); }

std::unique_ptr<Model> load(const std::string& param, LoadOptions o = {}) {
  o.n_threads = 2;
  if (o.kv_tokens == 0) o.kv_tokens = 512;
  o.compute = param.ends_with("@bf16") ? Compute::kBF16 : Compute::kF32;
  return Model::load(testing::fixture_dir(fixture_of(param)), o);
}

SpeculationOptions ngram(int64_t k = 4) {
  return {.proposer = std::make_shared<NgramProposer>(),
          .ladder = speculative::DraftLadder::constant(k)};
}

// A prompt of one token repeated: the context has n-grams to look up from the first step, and
// the random-weight fixtures of every non-hybrid family then fall into loops the lookup drafts
// (the random Gated DeltaNet fixtures do not: ScriptedDrafts makes acceptance certain there).
std::vector<int32_t> repeating_prompt() { return std::vector<int32_t>(12, 7); }

GenerateOptions greedy(int64_t n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.ignore_eos = true;
  return o;
}

GenerateResult run(Model& m, const std::vector<int32_t>& prompt, GenerateOptions o,
                   const std::string& adapter = "") {
  Session s(m, adapter);
  return s.generate(prompt, o);
}

// The drafts speculation must accept when its output is `out` (max_tokens long): the n-gram
// proposer walked over the known tokens step by step as the engine walks them (K drafts, fewer
// near the end), each step accepting the drafts that equal the tokens that follow.
int64_t oracle_accepted(const std::vector<int32_t>& prompt, const std::vector<int32_t>& out,
                        int64_t k) {
  NgramProposer p;
  auto s = p.alloc_state();
  p.prefill_drafter(*s, prompt, {});
  const auto max_tokens = static_cast<int64_t>(out.size());
  int64_t total = 0;
  std::vector<int32_t> d;
  for (int64_t i = 0; i + 1 < max_tokens;) {
    p.propose({.state = s.get(),
               .last = out[static_cast<size_t>(i)],
               .position = static_cast<int64_t>(prompt.size()) + i,
               .n = std::min(k, max_tokens - (i + 1) - 1)},
              d);
    int64_t a = 0;
    while (a < static_cast<int64_t>(d.size()) &&
           d[static_cast<size_t>(a)] == out[static_cast<size_t>(i + 1 + a)]) {
      ++a;
    }
    p.after_verify(*s, a);
    total += a;
    i += a + 1;
  }
  return total;
}

class GreedyIdentity : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyIdentity, NgramDraftsChangeNoToken) {
  auto m = load(GetParam());
  const std::vector<int32_t> prompt = repeating_prompt();
  constexpr int64_t kTokens = 64;
  const GenerateResult plain = run(*m, prompt, greedy(kTokens));
  GenerateOptions o = greedy(kTokens);
  o.speculation = ngram();
  const GenerateResult spec = run(*m, prompt, o);
  ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(kTokens));
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(spec.stop, plain.stop);
  EXPECT_EQ(plain.speculation.drafted, 0);
  // Verification is exact, so what is accepted is what the plain output makes certain.
  const int64_t want = oracle_accepted(prompt, plain.tokens, 4);
  EXPECT_EQ(spec.speculation.accepted, want);
  if (m->state_pool() == nullptr) {
    EXPECT_GT(want, 0) << "the prompt gives this fixture no acceptable draft; pick another";
  }
  EXPECT_GE(spec.speculation.drafted, spec.speculation.accepted);
  EXPECT_LE(spec.speculation.drafted, 4 * spec.speculation.verify_steps);
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages()) << "pages leaked";
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GreedyIdentity,
    ::testing::Values("llama_f32", "llama_bf16", "qwen2_f32", "qwen2_bf16", "qwen3_f32",
                      "qwen3_bf16", "qwen3_bf16@bf16", "qwen3_moe_f32", "qwen3_moe_bf16",
                      "qwen3_next_f32", "qwen3_next_bf16", "qwen3_5_text_f32", "qwen3_5_text_bf16",
                      "qwen3_5_moe_text_f32", "qwen3_5_f32", "deepseek_v3_bias_bf16",
                      "deepseek_v3_noqlora_bf16", "deepseek_v3_fp8", "glm4_moe_plain_bf16",
                      "glm4_moe_qknorm_bf16", "quant_ct_w4a16", "quant_modelopt_nvfp4"),
    [](const ::testing::TestParamInfo<std::string>& p) {
      std::string name = p.param;
      for (char& c : name)
        if (c == '@') c = '_';
      return name;
    });

// Drafts the known right answer (`truth`: the prompt and the plain greedy output) with one
// wrong token planted at a place that moves each step (j = step % (n + 1); j = n plants none),
// so each verify accepts exactly j drafts and rejects the rest: certain acceptance and certain
// rollback on any model. With hidden_size > 0 it reads the target's hidden rows and keeps
// every row it was handed, by position, to compare with the target's own.
class ScriptedProposer final : public speculative::DraftProposer {
 public:
  ScriptedProposer(std::vector<int32_t> truth, int32_t vocab, int64_t hidden_size = 0)
      : truth_(std::move(truth)), vocab_(vocab), hidden_size_(hidden_size) {}

  std::string_view name() const override { return "scripted"; }
  bool needs_hidden() const override { return hidden_size_ > 0; }
  int64_t hidden_size() const override { return hidden_size_; }

  int64_t planted_accepts = 0;  // what the plan makes the verify accept, summed
  std::map<int64_t, std::vector<float>> hidden_by_position;
  int64_t hidden_rows_seen = 0;

 protected:
  std::unique_ptr<speculative::ProposerState> do_alloc_state() override {
    return std::make_unique<speculative::ProposerState>();
  }
  void do_prefill(speculative::ProposerState&, std::span<const int32_t> prompt,
                  ConstRows hidden) override {
    for (int64_t r = 0; r < hidden.n_rows; ++r) keep(r, hidden.row(r));
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), truth_.begin()));
  }
  void do_propose(const speculative::ProposeArgs& a, std::vector<int32_t>& drafts) override {
    if (a.hidden.n_rows == 1) keep(a.position - 1, a.hidden.row(0));
    EXPECT_EQ(a.last, truth_.at(static_cast<size_t>(a.position))) << "position " << a.position;
    const int64_t n = std::min<int64_t>(a.n, static_cast<int64_t>(truth_.size()) - a.position - 1);
    if (n <= 0) return;
    const int64_t j = step_++ % (n + 1);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = truth_[static_cast<size_t>(a.position + 1 + i)];
      drafts.push_back(i == j ? (t + 1) % vocab_ : t);
    }
    planted_ = j;
  }
  void do_after_verify(speculative::ProposerState&, int64_t drafted, int64_t accepted) override {
    if (drafted > 0) {
      // The engine may cap the drafts below what was proposed; then fewer are accepted.
      EXPECT_LE(accepted, planted_);
      planted_accepts += accepted;
    }
  }
  void do_catchup(speculative::ProposerState&, const speculative::CatchupRows& rows) override {
    for (int64_t r = 0; r < rows.hidden.n_rows; ++r) keep(rows.first_key + r, rows.hidden.row(r));
  }

 private:
  void keep(int64_t position, const float* row) {
    ++hidden_rows_seen;
    std::vector<float> v(row, row + hidden_size_);
    auto [it, fresh] = hidden_by_position.try_emplace(position, v);
    if (!fresh) {
      EXPECT_EQ(it->second, v) << "two different hidden rows for position " << position;
    }
  }

  std::vector<int32_t> truth_;
  int32_t vocab_;
  int64_t hidden_size_;
  int64_t step_ = 0;
  int64_t planted_ = 0;
};

class ScriptedDrafts : public ::testing::TestWithParam<std::string> {};

// Every family (the hybrids' recurrent state included) verifies, accepts exactly the drafts
// the plan makes right, rolls back the rest and still decodes the plain output.
TEST_P(ScriptedDrafts, AcceptExactlyThePlannedPrefixAndRollBackTheRest) {
  auto m = load(GetParam());
  const std::vector<int32_t> prompt = testing::Reference(fixture_of(GetParam())).ids("input_ids");
  constexpr int64_t kTokens = 40;
  const GenerateResult plain = run(*m, prompt, greedy(kTokens));
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), plain.tokens.begin(), plain.tokens.end());
  auto proposer = std::make_shared<ScriptedProposer>(truth, static_cast<int32_t>(m->vocab_size()));
  GenerateOptions o = greedy(kTokens);
  o.speculation = {.proposer = proposer, .ladder = speculative::DraftLadder::constant(5)};
  const GenerateResult spec = run(*m, prompt, o);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.speculation.accepted, 0);
  EXPECT_LT(spec.speculation.accepted, spec.speculation.drafted) << "nothing was rolled back";
  EXPECT_EQ(spec.speculation.accepted, proposer->planted_accepts);
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ScriptedDrafts,
                         ::testing::Values("qwen3_f32", "qwen3_moe_bf16", "qwen3_next_f32",
                                           "qwen3_next_bf16", "qwen3_5_text_f32",
                                           "qwen3_5_moe_text_bf16", "qwen3_5_f32",
                                           "deepseek_v3_noqlora_bf16", "glm4_moe_plain_bf16",
                                           "quant_ct_w4a16"));

// The ring keeps the state after each row of a step of at most ring_depth + 1 rows: a hybrid
// model drafts at most ring_depth tokens per step, none with a ring of depth 0, and the output
// stays the plain one.
TEST(SpeculationHybrid, DraftsStayWithinTheRing) {
  const std::string fixture = "qwen3_next_f32";
  const std::vector<int32_t> prompt = testing::Reference(fixture).ids("input_ids");
  constexpr int64_t kTokens = 32;
  for (int64_t depth : {0, 1, 2, 8}) {
    LoadOptions lo;
    lo.state_ring_depth = depth;
    auto m = load(fixture, lo);
    const GenerateResult plain = run(*m, prompt, greedy(kTokens));
    std::vector<int32_t> truth = prompt;
    truth.insert(truth.end(), plain.tokens.begin(), plain.tokens.end());
    GenerateOptions o = greedy(kTokens);
    o.speculation = {.proposer = std::make_shared<ScriptedProposer>(
                         truth, static_cast<int32_t>(m->vocab_size())),
                     .ladder = speculative::DraftLadder::constant(6)};
    const GenerateResult spec = run(*m, prompt, o);
    EXPECT_EQ(spec.tokens, plain.tokens) << "ring depth " << depth;
    EXPECT_LE(spec.speculation.drafted, std::min<int64_t>(depth, 6) * spec.speculation.verify_steps)
        << "ring depth " << depth;
    if (depth == 0) {
      EXPECT_EQ(spec.speculation.drafted, 0);
    } else {
      EXPECT_GT(spec.speculation.accepted, 0) << "ring depth " << depth;
    }
  }
}

// A conversation continues from what speculation left in the cache: turn after turn, the
// sequence holds the same tokens and pages as without speculation, and the replies are equal.
TEST(Speculation, ASessionContinuesAfterRollbackAsWithout) {
  for (const std::string fixture : {"qwen3_f32", "qwen3_next_f32"}) {
    auto m = load(fixture);
    const testing::Reference ref(fixture);
    const std::vector<std::vector<int32_t>> turns = {
        repeating_prompt(), ref.ids("input_ids_b"), {7, 7, 7, 7}};
    Session plain(*m);
    GenerateOptions on = greedy(24);
    on.speculation = ngram(3);
    Session spec(*m);
    int64_t drafted = 0;
    for (size_t t = 0; t < turns.size(); ++t) {
      const GenerateResult a = plain.generate(turns[t], greedy(24));
      const GenerateResult b = spec.generate(turns[t], on);
      drafted += b.speculation.drafted;
      EXPECT_EQ(b.tokens, a.tokens) << fixture << " turn " << t;
      EXPECT_EQ(spec.sequence().tokens, plain.sequence().tokens) << fixture << " turn " << t;
      EXPECT_EQ(spec.sequence().block_table.size(), plain.sequence().block_table.size());
    }
    EXPECT_GT(drafted, 0) << fixture;
  }
}

// Sampling: the verify draws exactly what the plain picks draw, so a seeded stream gives the
// same tokens with and without drafts (the distribution itself: tests/speculative).
TEST(Speculation, SampledWithASeedEqualsPlainSampling) {
  auto m = load("qwen3_f32");
  const std::vector<int32_t> prompt = repeating_prompt();
  for (uint64_t seed : {1u, 2u, 3u}) {
    GenerateOptions o = greedy(48);
    o.sampling = {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.05f};
    o.seed = seed;
    const GenerateResult plain = run(*m, prompt, o);
    o.speculation = ngram();
    const GenerateResult spec = run(*m, prompt, o);
    EXPECT_EQ(spec.tokens, plain.tokens) << "seed " << seed;
    EXPECT_EQ(spec.tokens.size(), 48u);
    for (int32_t t : spec.tokens) EXPECT_TRUE(t >= 0 && t < m->vocab_size());
    EXPECT_GT(spec.speculation.drafted, 0) << "seed " << seed;
  }
}

// Several streams in one step, more draft rows than max_rows has room for (the dispatch share),
// LoRA adapters mixed per stream, chains and draft trees: each stream's output is its plain one.
TEST(Speculation, BatchedStreamsWithAdaptersEqualPlain) {
  LoadOptions lo;
  lo.max_rows = 7;
  auto m = load("qwen3_f32", lo);
  LoraPool& pool = m->enable_lora({.max_loras = 2, .max_rank = 16});
  for (const char* a : {"a", "b"})
    pool.load(a, testing::fixture_dir(std::string("lora/qwen3_dense/") + a), /*pinned=*/true);
  const testing::Reference ref("qwen3_f32");
  const std::vector<std::vector<int32_t>> prompts = {
      repeating_prompt(), ref.ids("input_ids"), ref.ids("input_ids_b"), {7, 7, 7, 7, 7}};
  const std::vector<std::string> adapters = {"a", "", "b", "a"};
  GenerateOptions o = greedy(40);
  const std::vector<GenerateResult> plain = generate_batch(*m, prompts, o, adapters);
  // Chains, then trees cut to the rows left (their first nodes, still a tree).
  for (const bool tree : {false, true}) {
    o.speculation = ngram();
    o.speculation.dispatch_cap = 5;
    if (tree) o.speculation.tree = speculative::DraftTree::parse("-1,-1,0,1,2");
    const std::vector<GenerateResult> spec = generate_batch(*m, prompts, o, adapters);
    int64_t accepted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "stream " << i << (tree ? ", tree" : "");
      accepted += spec[i].speculation.accepted;
    }
    EXPECT_GT(accepted, 0);
    EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
  }
}

// A LoRA adapter alone (the base fixture falls into a loop the lookup drafts).
TEST(Speculation, WithALoraAdapterGreedyIsUnchanged) {
  auto m = load("qwen3_f32");
  m->enable_lora({.max_loras = 1, .max_rank = 16})
      .load("c", testing::fixture_dir("lora/qwen3_dense/c"), /*pinned=*/true);
  const std::vector<int32_t> prompt = repeating_prompt();
  const GenerateResult plain = run(*m, prompt, greedy(64), "c");
  GenerateOptions o = greedy(64);
  o.speculation = ngram();
  const GenerateResult spec = run(*m, prompt, o, "c");
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(spec.speculation.accepted, oracle_accepted(prompt, plain.tokens, 4));
  EXPECT_GT(spec.speculation.accepted, 0);
}

// The ends: a stop string, eos, max_tokens of 1 and 2, and a context that fills up, end the
// stream where plain decoding ends it, with the same text.
TEST(Speculation, EndsFallWhereThePlainStreamEnds) {
  LoadOptions lo;
  lo.kv_tokens = 96;
  auto m = Model::load("models/demo", lo);
  const std::vector<int32_t> prompt =
      m->tokenizer()->encode("And God said, I am the LORD. And God said, I am the LORD.", true);
  struct Case {
    int64_t n;
    std::vector<std::string> stop;
    bool ignore_eos;
  };
  for (const Case& c : {Case{200, {}, false}, Case{60, {"the land"}, false}, Case{1, {}, true},
                        Case{2, {}, true}, Case{200, {}, true}}) {
    GenerateOptions o;
    o.max_new_tokens = c.n;
    o.stop_strings = c.stop;
    o.ignore_eos = c.ignore_eos;
    const GenerateResult plain = run(*m, prompt, o);
    o.speculation = ngram();
    const GenerateResult spec = run(*m, prompt, o);
    EXPECT_EQ(spec.tokens, plain.tokens) << c.n;
    EXPECT_EQ(spec.text, plain.text) << c.n;
    EXPECT_EQ(spec.stop, plain.stop) << c.n;
    EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages());
  }
}

// A proposer that reads the target's hidden states is handed the target's own final-norm rows:
// the prompt's, the row that produced each `last`, the accepted spans' — each equal, bit for
// bit, to that position's row of one plain pass over the whole text.
TEST(Speculation, AHiddenReadingProposerGetsTheTargetsRows) {
  for (const std::string fixture : {"qwen3_f32", "qwen3_next_f32"}) {
    auto m = load(fixture);
    const int64_t H = m->config().hidden_size;
    const std::vector<int32_t> prompt = testing::Reference(fixture).ids("input_ids");
    const GenerateResult plain = run(*m, prompt, greedy(24));
    std::vector<int32_t> truth = prompt;
    truth.insert(truth.end(), plain.tokens.begin(), plain.tokens.end());
    auto proposer =
        std::make_shared<ScriptedProposer>(truth, static_cast<int32_t>(m->vocab_size()), H);
    GenerateOptions o = greedy(24);
    o.speculation = {.proposer = proposer, .ladder = speculative::DraftLadder::constant(3)};
    const GenerateResult spec = run(*m, prompt, o);
    EXPECT_EQ(spec.tokens, plain.tokens) << fixture;
    EXPECT_GT(spec.speculation.accepted, 0) << fixture;

    // The reference: every position's final-norm row from one pass.
    std::vector<float> want;
    Speculator reference(*m, o.speculation);
    const HiddenSink sink = reference.sink_into(want, 0);
    Sequence seq;
    std::vector<float> logits(truth.size() * static_cast<size_t>(m->vocab_size()));
    const StepItem all{.seq = &seq, .ids = truth, .logits = LogitRows::kAll};
    m->step({&all, 1}, logits, &sink);
    m->release(seq);
    ASSERT_EQ(want.size(), truth.size() * static_cast<size_t>(H));
    // The prompt's rows, then one row per fed token, without holes; the last step's rows are
    // not handed over (the stream ended), so up to 1 + 3 drafts' rows may be missing at the end.
    const auto& got = proposer->hidden_by_position;
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got.begin()->first, 0);
    EXPECT_EQ(got.rbegin()->first + 1, static_cast<int64_t>(got.size())) << fixture << ": a hole";
    EXPECT_GE(got.size() + 4, truth.size() - 1) << fixture;
    for (const auto& [pos, row] : got) {
      ASSERT_LT(pos, static_cast<int64_t>(truth.size()));
      const std::vector<float> expect(want.begin() + pos * H, want.begin() + (pos + 1) * H);
      EXPECT_EQ(row, expect) << fixture << " position " << pos;
    }
  }
}

// What needs no model run: a proposer whose hidden rows do not fit the model, a dispatch cap
// out of range or below the draft count.
TEST(Speculation, BadOptionsAreClearErrors) {
  auto m = load("qwen3_f32");
  auto wrong = std::make_shared<ScriptedProposer>(std::vector<int32_t>{1}, 4, 3);
  try {
    Speculator s(*m, {.proposer = wrong});
    FAIL() << "a hidden size of 3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Speculator(*m, {.proposer = std::make_shared<NgramProposer>(), .dispatch_cap = 0}),
               Error);
  EXPECT_THROW(Speculator(*m, {.proposer = std::make_shared<NgramProposer>(),
                               .ladder = speculative::DraftLadder::constant(8),
                               .dispatch_cap = 4}),
               Error);
}

// The checkpoint's MTP layer as the drafter (engine/mtp_proposer.h): greedy output unchanged
// token for token, the drafter fed the target's hidden rows through prefill, verify and
// catch-up, and every page (the target's and the drafter's) back after — with the drafter
// prefilled over the prompt and without (drafter_prefill off: its rows start at key P - 1).
class MtpGreedyIdentity : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpGreedyIdentity, MtpDraftsChangeNoToken) {
  auto m = load(GetParam());
  const std::vector<int32_t> prompt = {5, 9, 5, 9, 5, 9, 5, 11, 3};
  constexpr int64_t kTokens = 40;
  const GenerateResult plain = run(*m, prompt, greedy(kTokens));
  ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(kTokens));
  for (const bool prefill : {true, false}) {
    GenerateOptions o = greedy(kTokens);
    auto drafter = MtpProposer::load(*m);
    const MtpProposer* d = drafter.get();
    o.speculation = {.proposer = std::move(drafter),
                     .ladder = speculative::DraftLadder::constant(3),
                     .drafter_prefill = prefill};
    const GenerateResult spec = run(*m, prompt, o);
    EXPECT_EQ(spec.tokens, plain.tokens) << "drafter prefill " << prefill;
    EXPECT_EQ(spec.stop, plain.stop);
    EXPECT_GT(spec.speculation.drafted, 0);
    EXPECT_GE(spec.speculation.drafted, spec.speculation.accepted);
    EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages()) << "target pages leaked";
    EXPECT_EQ(d->kv_pool().free_pages(), d->kv_pool().n_pages()) << "drafter pages leaked";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpGreedyIdentity,
                         ::testing::Values("deepseek_v3_mtp_bf16", "glm4_moe_qknorm_bf16",
                                           "qwen3_next_bf16"));

}  // namespace
}  // namespace metrale
