// The draft ladder: rung choice by active sequences (first n_max >= active, else the last),
// drafts clamped to 1..num_drafts (an explicit 0 kept), malformed specs named by rung, the dispatch
// cap's range, and fit_dispatch_cap's even share.
#include "speculative/ladder.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "support/test_support.h"

namespace metrale::speculative {
namespace {

using test::error_of;

TEST(DraftLadder, PicksTheFirstRungThatHoldsTheBatch) {
  const DraftLadder l = DraftLadder::parse("4:3,8:3,16:1,32:1", 3);
  ASSERT_EQ(l.rungs().size(), 4u);
  EXPECT_EQ(l.drafts_for(0), 3);
  EXPECT_EQ(l.drafts_for(1), 3);
  EXPECT_EQ(l.drafts_for(4), 3);
  EXPECT_EQ(l.drafts_for(5), 3);
  EXPECT_EQ(l.drafts_for(8), 3);
  EXPECT_EQ(l.drafts_for(9), 1);
  EXPECT_EQ(l.drafts_for(32), 1);
  EXPECT_EQ(l.drafts_for(1000), 1);  // past the last rung: the last rung

  const DraftLadder steps = DraftLadder::parse("1:4,2:3,4:2", 4);
  EXPECT_EQ(steps.drafts_for(1), 4);
  EXPECT_EQ(steps.drafts_for(2), 3);
  EXPECT_EQ(steps.drafts_for(3), 2);
  EXPECT_EQ(steps.drafts_for(64), 2);
}

TEST(DraftLadder, ClampsDraftsToNumDraftsAndKeepsAnExplicitZero) {
  const DraftLadder l = DraftLadder::parse("2:9,4:0,8:2", 3);
  EXPECT_EQ(l.drafts_for(1), 3);  // 9 -> num_drafts
  EXPECT_EQ(l.drafts_for(3), 0);  // 0: no drafts at this width
  EXPECT_EQ(l.drafts_for(8), 2);
  EXPECT_EQ(DraftLadder::constant(5).drafts_for(1 << 20), 5);
}

TEST(DraftLadder, MalformedSpecsNameTheRung) {
  const auto err = [](const char* spec) { return error_of([&] { DraftLadder::parse(spec, 4); }); };
  EXPECT_NE(err("").find("--draft-ladder: empty ladder"), std::string::npos);
  EXPECT_NE(err("4:3,8").find("--draft-ladder: rung 2 '8': expected n_max:drafts"),
            std::string::npos);
  EXPECT_NE(err("4:3,x:1").find("rung 2 'x:1': n_max: expected a positive integer, found 'x'"),
            std::string::npos);
  EXPECT_NE(err("0:3").find("rung 1 '0:3': n_max: expected a positive integer, found '0'"),
            std::string::npos);
  EXPECT_NE(err("4:3,8:-1").find("rung 2 '8:-1': drafts: expected a non-negative integer"),
            std::string::npos);
  EXPECT_NE(err("4:3,8:2.5").find("found '2.5'"), std::string::npos);
  EXPECT_NE(err("4:3, 8:2").find("rung 2 ' 8:2': n_max"), std::string::npos);
  EXPECT_NE(err("4:3,").find("rung 2 '': expected n_max:drafts"), std::string::npos);
  EXPECT_NE(err("8:3,4:1").find("rung 2 '4:1': n_max 4 must be above the previous rung's 8"),
            std::string::npos);
  EXPECT_NE(err("4:3,4:1").find("rung 2"), std::string::npos);
  EXPECT_NE(err("4:").find("drafts: expected a non-negative integer, found ''"), std::string::npos);
  EXPECT_NE(err("99999999999999999999:1").find("rung 1"), std::string::npos);
  EXPECT_NE(error_of([] {
              DraftLadder::parse("4:3", 0, "--draft-ladder");
            }).find("--draft-ladder: the draft count must be in 1..128, found 0"),
            std::string::npos);
}

TEST(DispatchCap, RangeAndTheDraftCountUnderIt) {
  check_dispatch_cap(kDefaultDispatchCap, 3);
  check_dispatch_cap(1, 1);
  check_dispatch_cap(128, 128);
  EXPECT_NE(error_of([] { check_dispatch_cap(0, 1); }).find("--dispatch-cap: expected 1..128"),
            std::string::npos);
  EXPECT_NE(error_of([] { check_dispatch_cap(129, 1); }).find("found 129"), std::string::npos);
  EXPECT_NE(error_of([] {
              check_dispatch_cap(8, 9);
            }).find("--draft-tokens: 9 drafts per step is outside 1..8 (--dispatch-cap)"),
            std::string::npos);
}

TEST(DispatchCap, FitSharesTheCapEvenly) {
  std::vector<int64_t> under = {3, 3, 3};
  fit_dispatch_cap(under, 32);
  EXPECT_EQ(under, (std::vector<int64_t>{3, 3, 3}));

  std::vector<int64_t> d = {5, 1, 5, 5};
  fit_dispatch_cap(d, 10);  // level 3 fills 3+1+3+3 = 10
  EXPECT_EQ(d, (std::vector<int64_t>{3, 1, 3, 3}));

  std::vector<int64_t> e = {5, 1, 5, 5};
  fit_dispatch_cap(e, 12);  // level 3 fills 10; two left go to the first two still short
  EXPECT_EQ(e, (std::vector<int64_t>{4, 1, 4, 3}));

  std::vector<int64_t> many(40, 3);
  fit_dispatch_cap(many, 32);
  EXPECT_EQ(std::accumulate(many.begin(), many.end(), int64_t{0}), 32);
  for (size_t i = 0; i < many.size(); ++i) EXPECT_EQ(many[i], i < 32 ? 1 : 0) << i;

  std::vector<int64_t> none = {2, 2};
  fit_dispatch_cap(none, 0);
  EXPECT_EQ(none, (std::vector<int64_t>{0, 0}));
}

}  // namespace
}  // namespace metrale::speculative
