// MTP carry on a hybrid target (tests/data/fixtures/qwen3_next_bf16: Gated DeltaNet and
// attention layers, and Qwen3-Next's mtp.* drafter), through the scheduler: a session's second
// turn adopts the drafter rows its first turn left while the target resumes from a recurrent-
// state snapshot of the prefix cache (the Marconi floor is this executable's 32 tokens), so the
// drafter computes rows only past the carried span. The output equals the same turn run without
// the carry, and without speculation.
#include <gtest/gtest.h>

#include <random>

#include "../stream_drain.h"
#include "engine/mtp_proposer.h"
#include "engine/session.h"
#include "serve/scheduler.h"
#include "test_floor.h"

namespace metrale {
namespace {

using serve_test::drain;
using serve_test::Drained;
using serve_test::settled;

std::unique_ptr<Model> load() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 512;
  o.max_rows = 64;
  o.state_snapshots = 4;
  return Model::load("tests/data/fixtures/qwen3_next_bf16", o);
}

ServeRequest turn(std::vector<int32_t> prompt, int64_t max_tokens) {
  ServeRequest r;
  r.prompt = std::move(prompt);
  r.session = "chat";
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

int64_t outcome(const SchedulerStats& st, speculative::CarryOutcome o) {
  return st.carry_outcomes[static_cast<size_t>(o)];
}

struct TurnTwo {
  Drained out;
  SchedulerStats before, after;  // after turn 1, after turn 2
};

// Turn 1, then turn 2, in one scheduler with MTP drafting (carry_tokens 0: no carry); every
// drafter page is back once it stops.
TurnTwo run_turns(Model& m, const ServeRequest& first, const ServeRequest& second,
                  int64_t carry_tokens) {
  const std::shared_ptr<MtpProposer> drafter =
      MtpProposer::load(m, {.kv_tokens = mtp_kv_tokens(m, 1, 3) + carry_tokens});
  TurnTwo t;
  {
    Scheduler sched(
        m, {.max_seqs = 1,
            .prefill_chunk = 24,
            .speculation = {.proposer = drafter, .ladder = speculative::DraftLadder::constant(3)},
            .carry_tokens = carry_tokens});
    drain(*sched.submit(first));
    t.before = settled(sched);
    t.out = drain(*sched.submit(second));
    t.after = settled(sched);
  }
  EXPECT_EQ(drafter->kv_pool().free_pages(), drafter->kv_pool().n_pages())
      << "drafter pages leaked";
  return t;
}

TEST(HybridMtpCarry, TurnTwoAdoptsRowsWhileTheTargetResumesFromASnapshot) {
  serve_test::use_hybrid_test_floor();
  auto model = load();
  ASSERT_NE(model->state_pool(), nullptr) << "the fixture is not hybrid";
  std::mt19937 rng(5);
  std::vector<int32_t> p1;
  for (int i = 0; i < 40; ++i) p1.push_back(static_cast<int32_t>(rng() % 300));
  const ServeRequest first = turn(p1, 16);
  std::vector<int32_t> p2 = p1;
  {
    GenerateOptions g;
    g.max_new_tokens = first.max_tokens;
    g.ignore_eos = true;
    Session s(*model);
    const GenerateResult reply = s.generate(p1, g);
    p2.insert(p2.end(), reply.tokens.begin(), reply.tokens.end());
  }
  p2.insert(p2.end(), {7, 8, 9, 10, 12, 5, 9});
  const ServeRequest second = turn(p2, 20);
  GenerateResult want;
  {
    GenerateOptions g;
    g.max_new_tokens = second.max_tokens;
    g.ignore_eos = true;
    Session s(*model);
    want = s.generate(p2, g);
  }

  const TurnTwo plain = run_turns(*model, first, second, 0);
  const TurnTwo carried = run_turns(*model, first, second, 1024);
  const auto P2 = static_cast<int64_t>(p2.size());
  EXPECT_EQ(plain.out.tokens, want.tokens);
  EXPECT_EQ(carried.out.tokens, want.tokens);
  EXPECT_GT(carried.out.usage.draft_tokens, 0);

  // Without the carry the stream runs its whole input for the drafter's hiddens.
  EXPECT_EQ(outcome(plain.after, speculative::CarryOutcome::kAdopted), 0);
  EXPECT_EQ(plain.out.usage.cached_tokens, 0);
  EXPECT_EQ(plain.after.drafter_prefill_rows - plain.before.drafter_prefill_rows, P2 - 1);

  // With it: adopted, the target resumed from a snapshot at a page boundary at or past the
  // floor (inside the carried span), and the drafter computed only the rows past the adopted.
  EXPECT_EQ(outcome(carried.after, speculative::CarryOutcome::kAdopted), 1);
  const int64_t adopted = carried.after.carry_rows_adopted;
  const int64_t computed = carried.after.drafter_prefill_rows - carried.before.drafter_prefill_rows;
  EXPECT_GT(adopted, 0);
  EXPECT_EQ(adopted + computed, P2 - 1);
  EXPECT_LT(computed, P2 - 1);
  const int64_t cached = carried.out.usage.cached_tokens;
  EXPECT_GE(cached, serve_test::kHybridFloor);
  EXPECT_EQ(cached % model->kv_pool().page_size(), 0);
  EXPECT_LE(cached, adopted);
  EXPECT_GT(carried.before.cache.snapshots_held, 0);
  std::printf(
      "hybrid carry: turn 2 of %lld tokens: %lld drafter rows adopted, %lld computed "
      "(%lld without carry), the target resumed at %lld; %lld of %lld drafts accepted\n",
      static_cast<long long>(P2), static_cast<long long>(adopted), static_cast<long long>(computed),
      static_cast<long long>(P2 - 1), static_cast<long long>(cached),
      static_cast<long long>(carried.out.usage.accepted_draft_tokens),
      static_cast<long long>(carried.out.usage.draft_tokens));
}

}  // namespace
}  // namespace metrale
