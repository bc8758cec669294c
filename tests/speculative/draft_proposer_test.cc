// The DraftProposer seam: the lifecycle's bookkeeping (prefill once, one verify per propose,
// positions continuing the context), argument checks, and the per-sequence fallback of
// propose_batch — on a scripted proposer that records what it is asked.
#include "speculative/draft_proposer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/test_support.h"

namespace metrale::speculative {
namespace {

using test::error_of;

struct ScriptState : ProposerState {
  int id = 0;
  std::vector<std::string> calls;
};

// Proposes `last + 1, last + 2, ...`; records each call on its state.
class ScriptProposer : public DraftProposer {
 public:
  explicit ScriptProposer(bool hidden) : hidden_(hidden) {}
  std::string_view name() const override { return "script"; }
  bool needs_hidden() const override { return hidden_; }
  int64_t hidden_size() const override { return hidden_ ? 4 : 0; }
  int batch_calls = 0;

 protected:
  std::unique_ptr<ProposerState> do_alloc_state() override {
    auto s = std::make_unique<ScriptState>();
    s->id = next_id_++;
    return s;
  }
  void do_prefill(ProposerState& s, std::span<const int32_t> prompt, ConstRows) override {
    log(s, "prefill " + std::to_string(prompt.size()));
  }
  void do_propose(const ProposeArgs& a, std::vector<int32_t>& drafts) override {
    log(*a.state, "propose " + std::to_string(a.position));
    for (int64_t i = 1; i <= a.n; ++i) drafts.push_back(a.last + static_cast<int32_t>(i));
  }
  void do_after_verify(ProposerState& s, int64_t drafted, int64_t accepted) override {
    log(s, "verify " + std::to_string(drafted) + " " + std::to_string(accepted));
  }
  void do_catchup(ProposerState& s, const CatchupRows& r) override {
    log(s, "catchup " + std::to_string(r.first_key) + " " + std::to_string(r.ids.size()));
  }
  void do_free(ProposerState& s) override { log(s, "free"); }

 private:
  static void log(ProposerState& s, std::string c) {
    static_cast<ScriptState&>(s).calls.push_back(std::move(c));
  }
  bool hidden_;
  int next_id_ = 0;
};

// A proposer with a batched form of its own.
class BatchedProposer : public ScriptProposer {
 public:
  BatchedProposer() : ScriptProposer(false) {}

 protected:
  void do_propose_batch(std::span<const ProposeArgs> args,
                        std::span<std::vector<int32_t>> drafts) override {
    ++batch_calls;
    for (size_t i = 0; i < args.size(); ++i) drafts[i].assign(args[i].n, 7);
  }
};

const std::vector<int32_t> kPrompt = {5, 6, 7};

TEST(DraftProposer, FollowsTheLifecycleAndTracksPositions) {
  ScriptProposer p(false);
  auto s = p.alloc_state();
  EXPECT_EQ(s->next_position(), -1);
  p.prefill_drafter(*s, kPrompt, {});
  EXPECT_EQ(s->next_position(), 3);
  std::vector<int32_t> drafts;
  p.propose({.state = s.get(), .last = 10, .position = 3, .n = 3}, drafts);
  EXPECT_EQ(drafts, (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(s->outstanding(), 3);
  p.after_verify(*s, 2);  // last at 3, two drafts at 4 and 5: the bonus comes at 6
  EXPECT_EQ(s->outstanding(), -1);
  EXPECT_EQ(s->next_position(), 6);
  // A step without drafting: propose(n = 0), then after_verify(0).
  p.propose({.state = s.get(), .last = 20, .position = 6, .n = 0}, drafts);
  EXPECT_TRUE(drafts.empty());
  p.after_verify(*s, 0);
  EXPECT_EQ(s->next_position(), 7);
  // Tokens decoded without the drafter: keys 6..8 (tokens at 7..9); the next last is at 10.
  const std::vector<int32_t> missed = {1, 2, 3};
  p.catchup(*s, {.first_key = 6, .ids = missed});
  EXPECT_EQ(s->next_position(), 10);
  p.free_state(*s);
  const auto& calls = static_cast<ScriptState&>(*s).calls;
  EXPECT_EQ(calls, (std::vector<std::string>{"prefill 3", "propose 3", "verify 3 2", "propose 6",
                                             "verify 0 0", "catchup 6 3", "free"}));
}

TEST(DraftProposer, RefusesCallsOutOfOrder) {
  ScriptProposer p(false);
  auto s = p.alloc_state();
  std::vector<int32_t> d;
  EXPECT_NE(error_of([&] {
              p.propose({.state = s.get(), .last = 1, .position = 1, .n = 1}, d);
            }).find("propose before prefill_drafter"),
            std::string::npos);
  p.prefill_drafter(*s, kPrompt, {});
  EXPECT_NE(error_of([&] { p.prefill_drafter(*s, kPrompt, {}); }).find("already prefilled"),
            std::string::npos);
  EXPECT_NE(error_of([&] { p.after_verify(*s, 0); }).find("without drafts awaiting"),
            std::string::npos);
  // Past the context: the tokens in between were never seen.
  EXPECT_NE(error_of([&] {
              p.propose({.state = s.get(), .last = 1, .position = 4, .n = 1}, d);
            }).find("position 4 outside 1..3"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              p.propose({.state = s.get(), .last = 1, .position = 3, .n = -1}, d);
            }).find("draft count must be >= 0"),
            std::string::npos);
  p.propose({.state = s.get(), .last = 1, .position = 3, .n = 2}, d);
  EXPECT_NE(error_of([&] {
              p.propose({.state = s.get(), .last = 1, .position = 3, .n = 1}, d);
            }).find("the previous 2 drafts await after_verify"),
            std::string::npos);
  const std::vector<int32_t> one = {1};
  EXPECT_NE(error_of([&] {
              p.catchup(*s, {.first_key = 2, .ids = one});
            }).find("2 drafts await after_verify"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              p.after_verify(*s, 3);
            }).find("accepted must be in 0..2 (the drafts proposed), found 3"),
            std::string::npos);
  p.after_verify(*s, 2);
  EXPECT_NE(error_of([&] {
              p.catchup(*s, {.first_key = 6, .ids = one});
            }).find("first key 6 outside 0..5"),
            std::string::npos);
}

TEST(DraftProposer, ProposeBelowTheContextRollsBack) {
  ScriptProposer p(false);
  auto s = p.alloc_state();
  p.prefill_drafter(*s, kPrompt, {});
  std::vector<int32_t> d;
  p.propose({.state = s.get(), .last = 1, .position = 3, .n = 2}, d);
  p.after_verify(*s, 2);
  EXPECT_EQ(s->next_position(), 6);
  p.propose({.state = s.get(), .last = 1, .position = 2, .n = 1}, d);
  p.after_verify(*s, 0);
  EXPECT_EQ(s->next_position(), 3);
}

TEST(DraftProposer, ChecksStatesAndHiddenRows) {
  ScriptProposer a(true);
  ScriptProposer b(true);
  auto sa = a.alloc_state();
  EXPECT_NE(error_of([&] { b.prefill_drafter(*sa, kPrompt, {}); }).find("not one this proposer"),
            std::string::npos);
  std::vector<float> h(3 * 4, 0.5f);
  EXPECT_NE(error_of([&] {
              a.prefill_drafter(*sa, kPrompt, rows_of(h.data(), 2, 4));
            }).find("expected 3 hidden rows, found 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              a.prefill_drafter(*sa, kPrompt, rows_of(h.data(), 3, 3));
            }).find("hidden rows of 4 columns, found 3"),
            std::string::npos);
  a.prefill_drafter(*sa, kPrompt, rows_of(h.data(), 3, 4));
  std::vector<int32_t> d;
  EXPECT_NE(error_of([&] {
              a.propose({.state = sa.get(), .last = 1, .position = 3, .n = 1}, d);
            }).find("expected 1 hidden rows, found 0"),
            std::string::npos);
  a.propose(
      {.state = sa.get(), .last = 1, .hidden = rows_of(h.data(), 1, 4), .position = 3, .n = 1}, d);
  EXPECT_EQ(d.size(), 1u);
  a.after_verify(*sa, 1);
  a.free_state(*sa);
  EXPECT_NE(error_of([&] { a.after_verify(*sa, 0); }).find("or it was freed"), std::string::npos);

  ScriptProposer plain(false);
  auto sp = plain.alloc_state();
  EXPECT_NE(error_of([&] {
              plain.prefill_drafter(*sp, kPrompt, rows_of(h.data(), 3, 4));
            }).find("reads no hidden states, but was given 3 rows"),
            std::string::npos);
  const std::vector<int32_t> bad = {1, -2};
  EXPECT_NE(error_of([&] { plain.prefill_drafter(*sp, bad, {}); }).find("found -2"),
            std::string::npos);
}

TEST(DraftProposer, BatchFallsBackToOneProposePerSequence) {
  ScriptProposer p(false);
  auto s0 = p.alloc_state();
  auto s1 = p.alloc_state();
  p.prefill_drafter(*s0, kPrompt, {});
  p.prefill_drafter(*s1, kPrompt, {});
  const std::vector<ProposeArgs> args = {{.state = s0.get(), .last = 10, .position = 3, .n = 2},
                                         {.state = s1.get(), .last = 20, .position = 3, .n = 1}};
  std::vector<std::vector<int32_t>> drafts(2, std::vector<int32_t>{99});
  p.propose_batch(args, drafts);
  EXPECT_EQ(drafts[0], (std::vector<int32_t>{11, 12}));
  EXPECT_EQ(drafts[1], (std::vector<int32_t>{21}));
  EXPECT_EQ(s0->outstanding(), 2);
  EXPECT_EQ(s1->outstanding(), 1);
  EXPECT_EQ(static_cast<ScriptState&>(*s1).calls.back(), "propose 3");

  p.after_verify(*s0, 0);
  p.after_verify(*s1, 0);
  const std::vector<ProposeArgs> twice = {args[0], args[0]};
  std::vector<int32_t> unused(2);
  EXPECT_NE(error_of([&] { p.propose_batch(twice, drafts); }).find("one state appears twice"),
            std::string::npos);
  std::vector<std::vector<int32_t>> one(1);
  EXPECT_NE(error_of([&] { p.propose_batch(args, one); }).find("2 sequences but 1 draft lists"),
            std::string::npos);
}

TEST(DraftProposer, BatchUsesAProposersOwnBatchedForm) {
  BatchedProposer p;
  auto s0 = p.alloc_state();
  auto s1 = p.alloc_state();
  p.prefill_drafter(*s0, kPrompt, {});
  p.prefill_drafter(*s1, kPrompt, {});
  const std::vector<ProposeArgs> args = {{.state = s0.get(), .last = 1, .position = 3, .n = 2},
                                         {.state = s1.get(), .last = 1, .position = 3, .n = 3}};
  std::vector<std::vector<int32_t>> drafts(2);
  p.propose_batch(args, drafts);
  EXPECT_EQ(p.batch_calls, 1);
  EXPECT_EQ(drafts[1], (std::vector<int32_t>{7, 7, 7}));
  EXPECT_EQ(s1->outstanding(), 3);
  // Nothing was logged per sequence: the batched form ran instead.
  EXPECT_EQ(static_cast<ScriptState&>(*s0).calls, (std::vector<std::string>{"prefill 3"}));
}

// start_drafter (drafter prefill off): a proposer that reads no hiddens prefills as usual and
// holds the whole context (first_key 0); one that reads them and builds no do_start is refused,
// naming the call; a started state cannot be prefilled again.
TEST(DraftProposerStart, WithoutPrefill) {
  ScriptProposer tokens(false);
  auto s = tokens.alloc_state();
  EXPECT_EQ(s->first_key(), -1);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  tokens.start_drafter(*s, prompt);
  EXPECT_EQ(s->next_position(), 4);
  EXPECT_EQ(s->first_key(), 0);
  EXPECT_EQ(static_cast<ScriptState&>(*s).calls, std::vector<std::string>{"prefill 4"});
  EXPECT_NE(error_of([&] { tokens.prefill_drafter(*s, prompt, {}); }).find("already prefilled"),
            std::string::npos);
  tokens.free_state(*s);

  ScriptProposer hidden(true);
  auto h = hidden.alloc_state();
  EXPECT_NE(error_of([&] {
              hidden.start_drafter(*h, prompt);
            }).find("script proposer: start_drafter: drafting without a prefill"),
            std::string::npos);
  EXPECT_NE(error_of([&] { hidden.start_drafter(*h, {}); }).find("start_drafter: empty prompt"),
            std::string::npos);
  hidden.free_state(*h);
}

}  // namespace
}  // namespace metrale::speculative
