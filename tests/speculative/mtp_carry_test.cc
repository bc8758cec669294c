// MTP carry bookkeeping: which outcome a record and a request give, how many keys are adopted
// (min(last_key, common - 2)) and dropped, and the append plan (first key max(adopted + 1, lo),
// up to prompt_len - 2, the keys missing in between).
#include "speculative/mtp_carry.h"

#include <gtest/gtest.h>

#include <vector>

#include "support/test_support.h"

namespace metrale::speculative {
namespace {

using test::error_of;
using Ids = std::vector<int32_t>;

// A previous turn over 10 tokens whose drafter rows hold keys 0..8 (all of them).
CarryRecord turn_one() {
  return {
      .session = 42, .hidden_source = 7, .tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, .last_key = 8};
}

TEST(MtpCarry, ANextTurnAdoptsTheRowsOfTheCommonPrefix) {
  const CarryRecord r = turn_one();
  // The whole previous context, then the new turn's span.
  const Ids next = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  const CarryDecision d = usable_by(&r, {.session = 42, .hidden_source = 7, .prompt = next});
  EXPECT_EQ(d.outcome, CarryOutcome::kAdopted);
  EXPECT_EQ(d.common, 10);
  EXPECT_EQ(d.adopt_through, 8);  // min(8, 10 - 2)
  EXPECT_EQ(d.drop, 0);
  const AppendPlan p = plan_append(d.adopt_through, 0, static_cast<int64_t>(next.size()));
  EXPECT_EQ(p.first_key, 9);
  EXPECT_EQ(p.last_key, 11);  // prompt_len - 2
  EXPECT_EQ(p.count, 3);
  EXPECT_EQ(p.missing, 0);
}

TEST(MtpCarry, ADivergingPromptDropsTheTailRows) {
  const CarryRecord r = turn_one();
  // Agrees on t_0..t_5 (6 tokens): keys 0..4 hold (embed(t_{k+1}), hidden_k) of agreeing tokens.
  const Ids next = {1, 2, 3, 4, 5, 6, 99, 98};
  const CarryDecision d = usable_by(&r, {.session = 42, .hidden_source = 7, .prompt = next});
  EXPECT_EQ(d.outcome, CarryOutcome::kAdopted);
  EXPECT_EQ(d.common, 6);
  EXPECT_EQ(d.adopt_through, 4);
  EXPECT_EQ(d.drop, 4);  // keys 5..8
  const AppendPlan p = plan_append(d.adopt_through, 0, 8);
  EXPECT_EQ(p.first_key, 5);
  EXPECT_EQ(p.last_key, 6);
  EXPECT_EQ(p.count, 2);

  // A record whose rows stop early adopts only what it has.
  CarryRecord short_rows = turn_one();
  short_rows.last_key = 2;
  EXPECT_EQ(
      usable_by(&short_rows, {.session = 42, .hidden_source = 7, .prompt = next}).adopt_through, 2);
}

TEST(MtpCarry, EveryOutcomeIsReported) {
  const CarryRecord r = turn_one();
  const Ids next = {1, 2, 3, 4};
  EXPECT_EQ(usable_by(nullptr, {.session = 42, .prompt = next}).outcome, CarryOutcome::kNoCarry);
  EXPECT_EQ(usable_by(&r, {.session = 0, .hidden_source = 7, .prompt = next}).outcome,
            CarryOutcome::kNoCarry);
  CarryRecord no_session = r;
  no_session.session = 0;
  EXPECT_EQ(usable_by(&no_session, {.session = 0, .hidden_source = 7, .prompt = next}).outcome,
            CarryOutcome::kNoCarry);
  const CarryDecision foreign = usable_by(&r, {.session = 43, .hidden_source = 7, .prompt = next});
  EXPECT_EQ(foreign.outcome, CarryOutcome::kForeignSession);
  EXPECT_EQ(foreign.adopt_through, -1);
  EXPECT_EQ(foreign.drop, 9);
  EXPECT_EQ(usable_by(&r, {.session = 42, .hidden_source = 8, .prompt = next}).outcome,
            CarryOutcome::kForeignHiddens);
  CarryRecord rowless = r;
  rowless.last_key = -1;
  EXPECT_EQ(usable_by(&rowless, {.session = 42, .hidden_source = 7, .prompt = next}).outcome,
            CarryOutcome::kNoHiddens);
  const Ids one = {1, 5, 5};
  const CarryDecision m = usable_by(&r, {.session = 42, .hidden_source = 7, .prompt = one});
  EXPECT_EQ(m.outcome, CarryOutcome::kPrefixMismatch);
  EXPECT_EQ(m.common, 1);
  EXPECT_EQ(m.adopt_through, -1);
  // Exactly two in common: key 0 is adoptable.
  const Ids two = {1, 2, 5};
  const CarryDecision t = usable_by(&r, {.session = 42, .hidden_source = 7, .prompt = two});
  EXPECT_EQ(t.outcome, CarryOutcome::kAdopted);
  EXPECT_EQ(t.adopt_through, 0);

  EXPECT_EQ(carry_outcome_name(CarryOutcome::kAdopted), "adopted");
  EXPECT_EQ(carry_outcome_name(CarryOutcome::kNoCarry), "no_carry");
  EXPECT_EQ(carry_outcome_name(CarryOutcome::kPrefixMismatch), "prefix_mismatch");
  EXPECT_EQ(carry_outcome_name(CarryOutcome::kForeignHiddens), "foreign_hiddens");
  EXPECT_EQ(carry_outcome_name(CarryOutcome::kForeignSession), "foreign_session");
  EXPECT_EQ(carry_outcome_name(CarryOutcome::kNoHiddens), "no_hiddens");
}

TEST(MtpCarry, APlanStartsAtTheFirstHiddenTheTargetProduces) {
  // Nothing carried; the prefix cache resumed the target at 64 (a hybrid snapshot): keys 0..63
  // have no hidden this turn.
  const AppendPlan p = plan_append(-1, 64, 100);
  EXPECT_EQ(p.first_key, 64);
  EXPECT_EQ(p.last_key, 98);
  EXPECT_EQ(p.count, 35);
  EXPECT_EQ(p.missing, 64);
  // Carried through key 70: the carry covers the resumed span, nothing is missing.
  const AppendPlan c = plan_append(70, 64, 100);
  EXPECT_EQ(c.first_key, 71);
  EXPECT_EQ(c.count, 28);
  EXPECT_EQ(c.missing, 0);
  // Carried through 20, resumed at 64: keys 21..63 are missing.
  EXPECT_EQ(plan_append(20, 64, 100).missing, 43);
  // A one-token prompt has no prefill rows at all.
  const AppendPlan one = plan_append(-1, 0, 1);
  EXPECT_EQ(one.count, 0);
  EXPECT_EQ(one.missing, 0);
  // lo past the prompt: no rows to compute, and the missing ones stop at the last key.
  const AppendPlan past = plan_append(-1, 50, 10);
  EXPECT_EQ(past.count, 0);
  EXPECT_EQ(past.missing, 9);
}

TEST(MtpCarry, RejectsInconsistentInput) {
  CarryRecord bad = turn_one();
  bad.last_key = 9;  // key 9 would need t_10
  const Ids next = {1, 2, 3};
  EXPECT_NE(error_of([&] {
              usable_by(&bad, {.session = 42, .hidden_source = 7, .prompt = next});
            }).find("record key 9 needs token 10, but the record holds 10 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([] { plan_append(5, 0, 6); }).find("adopted key must be in -1..4, found 5"),
            std::string::npos);
  EXPECT_NE(error_of([] { plan_append(-1, -1, 6); }).find("lo must be >= 0"), std::string::npos);
  EXPECT_NE(error_of([] { plan_append(-1, 0, 0); }).find("prompt length must be >= 1"),
            std::string::npos);
}

}  // namespace
}  // namespace metrale::speculative
