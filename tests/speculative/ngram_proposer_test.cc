// The n-gram proposer: vLLM's longest-suffix rule (its docstring's example), the most recent
// occurrence on ties (llama.cpp's backward search), min_n / max_n, drafts cut at the end of the
// context, and the incremental index agreeing with a brute-force rescan through appends,
// rollbacks and catch-ups on random contexts.
#include "speculative/ngram_proposer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "support/test_support.h"

namespace metrale::speculative {
namespace {

using test::error_of;
using Ids = std::vector<int32_t>;

// Prefills `context` minus its last token and proposes with the last token as `last`.
Ids propose_on(NgramProposer& p, const Ids& context, int64_t n) {
  auto s = p.alloc_state();
  p.prefill_drafter(*s, std::span(context).first(context.size() - 1), {});
  Ids drafts;
  p.propose({.state = s.get(),
             .last = context.back(),
             .position = static_cast<int64_t>(context.size()) - 1,
             .n = n},
            drafts);
  return drafts;
}

// The rule, rescanning everything.
Ids brute_force(const Ids& t, int64_t min_n, int64_t max_n, int64_t k) {
  const auto last = static_cast<int64_t>(t.size()) - 1;
  for (int64_t n = std::min(max_n, last); n >= min_n; --n) {
    for (int64_t e = last - 1; e >= n - 1; --e) {
      if (std::equal(t.begin() + e - n + 1, t.begin() + e + 1, t.begin() + last - n + 1)) {
        return Ids(t.begin() + e + 1, t.begin() + std::min(e + k, last) + 1);
      }
    }
  }
  return {};
}

TEST(NgramProposer, MatchesVllmsDocumentedExample) {
  // vLLM's NgramProposer.propose docstring: [1,2,3,4,2,3], min_n 2, max_n 3, k 4: [4,2,3]
  // has no match, [2,3] matches at the start and returns the three tokens after it.
  NgramProposer p({.min_n = 2, .max_n = 3});
  EXPECT_EQ(propose_on(p, {1, 2, 3, 4, 2, 3}, 4), (Ids{4, 2, 3}));
}

TEST(NgramProposer, TheMostRecentOccurrenceWinsATie) {
  NgramProposer p({.min_n = 2, .max_n = 2});
  // [1,2] occurs twice before the suffix: followed by 9, then (more recently) by 8.
  EXPECT_EQ(propose_on(p, {1, 2, 9, 1, 2, 8, 1, 2}, 1), (Ids{8}));
  EXPECT_EQ(propose_on(p, {1, 2, 9, 1, 2, 8, 1, 2}, 3), (Ids{8, 1, 2}));
}

TEST(NgramProposer, TheLongestSuffixWinsOverRecency) {
  const Ids t = {3, 1, 2, 7, 4, 1, 2, 9, 3, 1, 2};
  NgramProposer longest({.min_n = 1, .max_n = 3});
  EXPECT_EQ(propose_on(longest, t, 2), (Ids{7, 4}));  // [3,1,2] at the start
  NgramProposer shorter({.min_n = 1, .max_n = 2});
  EXPECT_EQ(propose_on(shorter, t, 2), (Ids{9, 3}));  // [1,2], most recent
}

TEST(NgramProposer, NothingBelowMinN) {
  NgramProposer p({.min_n = 2, .max_n = 4});
  EXPECT_TRUE(propose_on(p, {1, 2, 3, 1}, 3).empty());  // only [1] recurs
  EXPECT_TRUE(propose_on(p, {5, 5}, 3).empty());        // the suffix [5,5] is the whole context
  NgramProposer one({.min_n = 1, .max_n = 4});
  EXPECT_EQ(propose_on(one, {1, 2, 3, 1}, 3), (Ids{2, 3, 1}));
  EXPECT_EQ(propose_on(one, {5, 5}, 3), (Ids{5}));  // overlapping: [5] at 0 is followed by 5
}

TEST(NgramProposer, DraftsStopAtTheEndOfTheContext) {
  NgramProposer p({.min_n = 2, .max_n = 2});
  EXPECT_EQ(propose_on(p, {1, 2, 3, 1, 2}, 5), (Ids{3, 1, 2}));
  EXPECT_TRUE(propose_on(p, {1, 2, 3, 1, 2}, 0).empty());
}

TEST(NgramProposer, AcceptedDraftsAndCatchupExtendTheContext) {
  NgramProposer p({.min_n = 1, .max_n = 3});
  auto s = p.alloc_state();
  const Ids prompt = {10, 11, 12, 13, 10};
  p.prefill_drafter(*s, prompt, {});
  Ids d;
  p.propose({.state = s.get(), .last = 11, .position = 5, .n = 3}, d);
  EXPECT_EQ(d, (Ids{12, 13, 10}));
  p.after_verify(*s, 2);  // 12 and 13 accepted; the target's bonus is 14
  EXPECT_EQ(Ids(NgramProposer::context(*s).begin(), NgramProposer::context(*s).end()),
            (Ids{10, 11, 12, 13, 10, 11, 12, 13}));
  p.propose({.state = s.get(), .last = 14, .position = 8, .n = 2}, d);
  EXPECT_TRUE(d.empty());  // 14 never occurred
  p.after_verify(*s, 0);
  // Decoded without drafting: 10, 11 at positions 9 and 10 (keys 8 and 9).
  const Ids missed = {10, 11};
  p.catchup(*s, {.first_key = 8, .ids = missed});
  p.propose({.state = s.get(), .last = 12, .position = 11, .n = 2}, d);
  // Context 10 11 12 13 10 11 12 13 14 10 11 12: the suffix [10,11,12] occurs at 0..2 and,
  // most recently, at 4..6, followed by 13, 14.
  EXPECT_EQ(d, (Ids{13, 14}));
  p.after_verify(*s, 0);
}

TEST(NgramProposer, IncrementalIndexEqualsABruteForceRescan) {
  for (const auto& [lo, hi] : {std::pair{1, 1}, {1, 3}, {2, 4}, {3, 3}, {1, 6}}) {
    for (uint32_t seed = 0; seed < 8; ++seed) {
      std::mt19937 rng(seed * 31 + lo * 7 + hi);
      std::uniform_int_distribution<int32_t> tok(0, 2);  // 3 tokens: many repeats
      NgramProposer p({.min_n = lo, .max_n = hi});
      auto s = p.alloc_state();
      Ids mirror = {tok(rng)};
      p.prefill_drafter(*s, mirror, {});
      Ids d;
      for (int step = 0; step < 400; ++step) {
        const int action = std::uniform_int_distribution<int>(0, 9)(rng);
        if (action == 0 && mirror.size() > 2) {
          // Roll back: propose at an earlier position.
          mirror.resize(std::uniform_int_distribution<size_t>(1, mirror.size() - 1)(rng));
        } else if (action == 1 && mirror.size() >= 2) {
          // Catch up two tokens, rewriting the last one.
          const Ids rows = {tok(rng), tok(rng)};
          mirror.pop_back();
          const auto first_key = static_cast<int64_t>(mirror.size()) - 1;
          mirror.insert(mirror.end(), rows.begin(), rows.end());
          p.catchup(*s, {.first_key = first_key, .ids = rows});
          continue;
        }
        const int32_t last = tok(rng);
        const auto position = static_cast<int64_t>(mirror.size());
        const int64_t n = std::uniform_int_distribution<int64_t>(0, 5)(rng);
        p.propose({.state = s.get(), .last = last, .position = position, .n = n}, d);
        mirror.push_back(last);
        const Ids want = n == 0 ? Ids{} : brute_force(mirror, lo, hi, n);
        ASSERT_EQ(d, want) << "min_n " << lo << " max_n " << hi << " seed " << seed << " step "
                           << step;
        const auto accepted =
            std::uniform_int_distribution<int64_t>(0, static_cast<int64_t>(d.size()))(rng);
        p.after_verify(*s, accepted);
        mirror.insert(mirror.end(), d.begin(), d.begin() + accepted);
        const auto ctx = NgramProposer::context(*s);
        ASSERT_EQ(Ids(ctx.begin(), ctx.end()), mirror);
      }
    }
  }
}

TEST(NgramProposer, RejectsOptionsOutsideTheirRanges) {
  EXPECT_NE(error_of([] { NgramProposer({.min_n = 0, .max_n = 2}); }).find("min_n: expected 1..64"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              NgramProposer({.min_n = 3, .max_n = 2});
            }).find("max_n: expected 3..64 (min_n..64), found 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { NgramProposer({.min_n = 1, .max_n = 65}); }).find("found 65"),
            std::string::npos);
}

// Trees: every earlier occurrence of the suffix contributes its continuation to a trie, the
// longest n-gram and the most recent first; the main chain is the chain propose() drafts, the
// other children what followed elsewhere, and the tree keeps the shape's order and depth.
TEST(NgramTree, BranchesAreWhatFollowedTheSuffixElsewhere) {
  NgramProposer p({.min_n = 1, .max_n = 2});
  // "1 2" was followed by 3 4 (most recent), by 5 6, and by 3 9.
  const Ids context = {1, 2, 3, 9, 0, 1, 2, 5, 6, 0, 1, 2, 3, 4, 0, 1, 2};
  const Ids chain = propose_on(p, context, 2);
  ASSERT_EQ(chain, (Ids{3, 4}));
  auto s = p.alloc_state();
  p.prefill_drafter(*s, std::span(context).first(context.size() - 1), {});
  const DraftTree shape = DraftTree::parse("-1,-1,-1,0,0,1,5");
  std::vector<TreeDrafts> out(1);
  const ProposeArgs a{.state = s.get(),
                      .last = context.back(),
                      .position = static_cast<int64_t>(context.size()) - 1,
                      .n = 2};
  p.propose_tree_batch({&a, 1}, shape, out);
  // Root children: 3 (twice; most recent first), 5; below 3: 4 then 9; below 5: 6. Node 2 (a
  // third root child) and node 6 (depth 3 > n) have nothing.
  EXPECT_EQ(out[0].tokens, (Ids{3, 5, 4, 9, 6}));
  EXPECT_EQ(out[0].parents, (std::vector<int64_t>{-1, -1, 0, 0, 1}));
  EXPECT_EQ(out[0].main_chain(), (std::vector<int64_t>{0, 2}));
  // The main chain's drafts are what after_verify answers; a path off it comes back by catchup.
  EXPECT_EQ(error_of([&] { p.after_verify(*s, 3); }).find("accepted must be in 0..2") !=
                std::string::npos,
            true);
  p.after_verify(*s, 1);
  const Ids path = {3, 9};
  p.catchup(*s, {.first_key = a.position, .ids = path});
  Ids want(context.begin(), context.end());
  want.insert(want.end(), path.begin(), path.end());
  const std::span<const int32_t> ctx = NgramProposer::context(*s);
  EXPECT_EQ(Ids(ctx.begin(), ctx.end()), want);
}

}  // namespace
}  // namespace metrale::speculative
