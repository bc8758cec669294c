// Verification: greedy (the longest prefix equal to the target's argmax, plus the bonus), tree
// greedy, rejection sampling's edge cases, and a statistical test that speculative sampling's
// output follows the target's distribution; the drafter trim rule.
//
// The statistical test: on a 4-token vocabulary, a target p and a drafter q that differ (q even
// gives 0 to tokens p favours), 40000 seeded runs each generate two tokens through speculative
// steps of two drafts; the 16 cells of (x1, x2) are compared with p(x1) p(x2 | x1) by
// Pearson's chi-square (15 degrees of freedom). The threshold 44.26 is the 1 - 1e-4 quantile
// of chi-square(15): were the seed drawn at random, a correct verifier would fail each such
// test with probability 1e-4 (the false-alarm rate); with the fixed seeds here the outcome is
// deterministic. The same statistic on tokens drawn from q alone (what accepting every draft
// would give) is checked to exceed the threshold by far, so the test can tell.
#include "speculative/verify.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "support/test_support.h"

namespace metrale::speculative {
namespace {

using test::error_of;
using Ids = std::vector<int32_t>;

constexpr int kV = 4;
using Dist = std::array<float, kV>;

// xoshiro-free: splitmix64 is enough for a test's uniform draws.
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : x_(seed) {}
  float uniform() {
    uint64_t z = (x_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * 0x1.0p-24f;
  }

 private:
  uint64_t x_;
};

Dist rotate(Dist d, int32_t by) {
  Dist r{};
  for (int i = 0; i < kV; ++i) r[(i + by) % kV] = d[i];
  return r;
}

// The target: depends on the context (its length and last token).
Dist target_of(const Ids& ctx) {
  if (ctx.empty()) return {0.1f, 0.2f, 0.3f, 0.4f};
  if (ctx.size() == 1) return rotate({0.5f, 0.25f, 0.15f, 0.1f}, ctx.back());
  return rotate({0.4f, 0.3f, 0.2f, 0.1f}, ctx.back());
}

// The drafter: wrong on purpose, and blind to token 3 at the start.
Dist draft_of(const Ids& ctx) {
  if (ctx.empty()) return {0.05f, 0.45f, 0.5f, 0.0f};
  if (ctx.size() == 1) return rotate({0.1f, 0.2f, 0.6f, 0.1f}, ctx.back() + 1);
  return {0.25f, 0.25f, 0.25f, 0.25f};
}

int32_t sample(const Dist& d, float u) {
  float total = 0;
  for (float x : d) total += x;
  float c = 0;
  for (int i = 0; i < kV; ++i) {
    c += d[i];
    if (d[i] > 0 && u * total < c) return i;
  }
  for (int i = kV - 1; i >= 0; --i) {
    if (d[i] > 0) return i;
  }
  return 0;
}

int32_t argmax(const Dist& d) {
  int32_t b = 0;
  for (int i = 1; i < kV; ++i) {
    if (d[i] > d[b]) b = i;
  }
  return b;
}

// Two tokens through speculative steps of two drafts each. `deterministic`: the drafter
// drafts q's argmax (one-hot q, no draft rows), as n-gram or an MTP argmax does.
Ids generate_two(TestRng& rng, bool deterministic) {
  Ids ctx;
  UniformDraw u = [&] { return rng.uniform(); };
  while (ctx.size() < 2) {
    Ids drafts;
    std::vector<float> p_rows, q_rows;
    Ids at = ctx;
    for (int j = 0; j < 2; ++j) {
      const Dist q = draft_of(at);
      const Dist p = target_of(at);
      p_rows.insert(p_rows.end(), p.begin(), p.end());
      q_rows.insert(q_rows.end(), q.begin(), q.end());
      const int32_t d = deterministic ? argmax(q) : sample(q, rng.uniform());
      drafts.push_back(d);
      at.push_back(d);
    }
    const Dist bonus = target_of(at);
    p_rows.insert(p_rows.end(), bonus.begin(), bonus.end());
    const ConstRows p = rows_of(p_rows.data(), 3, kV);
    const ConstRows q = rows_of(q_rows.data(), 2, kV);
    const VerifyResult r = verify_sampled(drafts, p, deterministic ? nullptr : &q, u);
    ctx.insert(ctx.end(), drafts.begin(), drafts.begin() + r.accepted);
    ctx.push_back(r.next);
  }
  ctx.resize(2);
  return ctx;
}

constexpr int kRuns = 40000;
constexpr double kChiSquare15At1e4 = 44.263;  // chi-square(15) quantile at 1 - 1e-4

// Pearson's statistic of the (x1, x2) counts against the target's joint.
double chi_square(const std::array<int64_t, kV * kV>& counts) {
  double stat = 0;
  const Dist p1 = target_of({});
  for (int32_t a = 0; a < kV; ++a) {
    const Dist p2 = target_of({a});
    for (int32_t b = 0; b < kV; ++b) {
      const double expected = kRuns * static_cast<double>(p1[a]) * p2[b];
      const double diff = static_cast<double>(counts[a * kV + b]) - expected;
      stat += diff * diff / expected;
    }
  }
  return stat;
}

TEST(SpeculativeSampling, OutputFollowsTheTargetDistribution) {
  for (const bool deterministic : {false, true}) {
    TestRng rng(deterministic ? 20240601 : 1234567);
    std::array<int64_t, kV * kV> counts{};
    for (int run = 0; run < kRuns; ++run) {
      const Ids two = generate_two(rng, deterministic);
      ++counts[two[0] * kV + two[1]];
    }
    const double stat = chi_square(counts);
    std::printf("chi-square(15), %s: %.2f (threshold %.2f)\n",
                deterministic ? "one-hot drafts" : "sampled drafts", stat, kChiSquare15At1e4);
    EXPECT_LT(stat, kChiSquare15At1e4) << (deterministic ? "one-hot drafts" : "sampled drafts");
  }
}

TEST(SpeculativeSampling, TheChiSquareTestTellsTheDrafterFromTheTarget) {
  // What accepting every draft would emit: the drafter's own joint.
  TestRng rng(99);
  std::array<int64_t, kV * kV> counts{};
  for (int run = 0; run < kRuns; ++run) {
    const int32_t a = sample(draft_of({}), rng.uniform());
    const int32_t b = sample(draft_of({a}), rng.uniform());
    ++counts[a * kV + b];
  }
  const double stat = chi_square(counts);
  std::printf("chi-square(15), drafter's joint: %.0f\n", stat);
  EXPECT_GT(stat, 100 * kChiSquare15At1e4);
}

TEST(SpeculativeSampling, EqualDistributionsAcceptEveryDraft) {
  TestRng rng(7);
  UniformDraw u = [&] { return rng.uniform(); };
  const std::vector<float> p = {0.1f, 0.2f, 0.3f,  0.4f,  0.4f,  0.3f,
                                0.2f, 0.1f, 0.25f, 0.25f, 0.25f, 0.25f};
  const ConstRows rows = rows_of(p.data(), 3, kV);
  const ConstRows q = rows_of(p.data(), 2, kV);
  for (int i = 0; i < 1000; ++i) {
    const Ids drafts = {sample({0.1f, 0.2f, 0.3f, 0.4f}, rng.uniform()),
                        sample({0.4f, 0.3f, 0.2f, 0.1f}, rng.uniform())};
    EXPECT_EQ(verify_sampled(drafts, rows, &q, u).accepted, 2);
  }
}

TEST(SpeculativeSampling, ADraftTheTargetRulesOutIsAlwaysReplaced) {
  TestRng rng(8);
  UniformDraw u = [&] { return rng.uniform(); };
  const std::vector<float> p = {0.0f, 0.5f, 0.5f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
  const ConstRows rows = rows_of(p.data(), 2, kV);
  for (int i = 0; i < 1000; ++i) {
    const VerifyResult r = verify_sampled(Ids{0}, rows, nullptr, u);
    EXPECT_EQ(r.accepted, 0);
    EXPECT_TRUE(r.next == 1 || r.next == 2) << r.next;
  }
}

TEST(SpeculativeSampling, RejectsBadRows) {
  UniformDraw u = [] { return 0.5f; };
  const std::vector<float> p = {0.5f, 0.5f, 0.0f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
  const ConstRows rows = rows_of(p.data(), 2, kV);
  EXPECT_NE(error_of([&] {
              verify_sampled(Ids{0, 1}, rows, nullptr, u);
            }).find("expected 3 target probability rows, found 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              verify_sampled(Ids{4}, rows, nullptr, u);
            }).find("draft 0: token 4 outside the vocabulary 0..3"),
            std::string::npos);
  const std::vector<float> q = {0.0f, 1.0f, 0.0f, 0.0f};
  const ConstRows qr = rows_of(q.data(), 1, kV);
  EXPECT_NE(error_of([&] {
              verify_sampled(Ids{0}, rows, &qr, u);
            }).find("draft 0: token 0 has draft probability 0"),
            std::string::npos);
  const std::vector<float> neg = {0.5f, -0.5f, 1.0f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
  EXPECT_NE(error_of([&] {
              verify_sampled(Ids{0}, rows_of(neg.data(), 2, kV), nullptr, u);
            }).find("target row 0: probability of token 1 is -0.5"),
            std::string::npos);
  const std::vector<float> q3 = {1.0f, 0.0f, 0.0f};
  EXPECT_NE(error_of([&] {
              const ConstRows r3 = rows_of(q3.data(), 1, 3);
              verify_sampled(Ids{0}, rows, &r3, u);
            }).find("draft rows have 3 columns, the target's 4"),
            std::string::npos);
}

TEST(GreedyVerify, AcceptsTheLongestAgreeingPrefixPlusOne) {
  // Rows' argmaxes: 3, 1, 0, 2.
  const std::vector<float> logits = {0, 1, 2, 5,  //
                                     0, 9, 1, 1,  //
                                     7, 1, 1, 1,  //
                                     0, 0, 4, 0};
  const ConstRows l = rows_of(logits.data(), 4, kV);
  EXPECT_EQ(verify_greedy(Ids{3, 1, 2}, l).accepted, 2);
  EXPECT_EQ(verify_greedy(Ids{3, 1, 2}, l).next, 0);
  EXPECT_EQ(verify_greedy(Ids{3, 1, 0}, l).accepted, 3);
  EXPECT_EQ(verify_greedy(Ids{3, 1, 0}, l).next, 2);  // the bonus
  EXPECT_EQ(verify_greedy(Ids{0, 1, 0}, l).accepted, 0);
  EXPECT_EQ(verify_greedy(Ids{0, 1, 0}, l).next, 3);
  EXPECT_EQ(verify_greedy(Ids{}, rows_of(logits.data(), 1, kV)).next, 3);
  // Ties go to the first maximum, as greedy sampling does.
  const std::vector<float> tie = {1, 4, 4, 0, 0, 0, 0, 0};
  EXPECT_EQ(verify_greedy(Ids{2}, rows_of(tie.data(), 2, kV)).accepted, 0);
  EXPECT_EQ(verify_greedy(Ids{1}, rows_of(tie.data(), 2, kV)).accepted, 1);
  EXPECT_NE(error_of([&] {
              verify_greedy(Ids{3, 1}, l);
            }).find("expected 3 target logits rows"),
            std::string::npos);
}

TEST(GreedyVerify, TreeFollowsTheTargetsArgmaxThroughBranches) {
  // Root's children: node 0 (token 1), node 1 (token 2); below node 1: node 2 (token 0),
  // node 3 (token 3); below node 3: node 4 (token 1).
  const DraftTree t = DraftTree::parse("-1,-1,1,1,3");
  const Ids tokens = {1, 2, 0, 3, 1};
  // Argmax per row: root 2, node0 0, node1 3, node2 0, node3 1, node4 2.
  const std::vector<float> logits = {0, 0, 9, 0,   // root
                                     9, 0, 0, 0,   // node 0
                                     0, 0, 0, 9,   // node 1
                                     9, 0, 0, 0,   // node 2
                                     0, 9, 0, 0,   // node 3
                                     0, 0, 9, 0};  // node 4
  const TreeVerifyResult r = verify_tree_greedy(t, tokens, rows_of(logits.data(), 6, kV));
  EXPECT_EQ(r.path, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(r.next, 2);  // node 4 is a leaf: its argmax is the bonus

  // The root wants 0, which no child drafted.
  std::vector<float> miss = logits;
  miss[0] = 99;
  const TreeVerifyResult m = verify_tree_greedy(t, tokens, rows_of(miss.data(), 6, kV));
  EXPECT_TRUE(m.path.empty());
  EXPECT_EQ(m.next, 0);

  // A chain tree agrees with chain verification.
  const std::vector<float> chain = {0, 1, 2, 5,  //
                                    0, 9, 1, 1,  //
                                    7, 1, 1, 1,  //
                                    0, 0, 4, 0};
  const TreeVerifyResult c =
      verify_tree_greedy(DraftTree::chain(3), Ids{3, 1, 2}, rows_of(chain.data(), 4, kV));
  EXPECT_EQ(c.path, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(c.next, 0);
  EXPECT_NE(error_of([&] {
              verify_tree_greedy(t, Ids{1, 2}, rows_of(logits.data(), 6, kV));
            }).find("the tree has 5 nodes, but 2 draft tokens"),
            std::string::npos);
}

TEST(DrafterTrim, ExactAndApproximateModes) {
  // Exact: only the row from the target's own hidden stays.
  EXPECT_EQ(drafter_trim({.drafted = 0, .accepted = 0, .exact = true}), 0);
  EXPECT_EQ(drafter_trim({.drafted = 1, .accepted = 1, .exact = true}), 0);
  EXPECT_EQ(drafter_trim({.drafted = 4, .accepted = 2, .exact = true}), 3);
  EXPECT_EQ(drafter_trim({.drafted = 4, .accepted = 4, .exact = true, .refeed = true}), 3);
  // Otherwise: the rejected rows, plus accepted - 1 more when they are refed.
  EXPECT_EQ(drafter_trim({.drafted = 4, .accepted = 1}), 3);
  EXPECT_EQ(drafter_trim({.drafted = 4, .accepted = 4}), 0);
  EXPECT_EQ(drafter_trim({.drafted = 4, .accepted = 0}), 4);
  EXPECT_EQ(drafter_trim({.drafted = 4, .accepted = 3, .refeed = true}), 3);  // 1 + 2
  EXPECT_EQ(drafter_trim({.drafted = 4, .accepted = 0, .refeed = true}), 3);  // 4 - 1
  EXPECT_EQ(drafter_trim({.drafted = 0, .accepted = 0, .refeed = true}), 0);  // not -1
  EXPECT_EQ(drafter_trim({.drafted = 5, .accepted = 5, .refeed = true}), 4);
  EXPECT_NE(error_of([] {
              drafter_trim({.drafted = 2, .accepted = 3});
            }).find("accepted must be in 0..drafted, found 3 of 2"),
            std::string::npos);
}

}  // namespace
}  // namespace metrale::speculative
