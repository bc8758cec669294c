// Draft trees: chains and parent lists, validation and spec parsing, the tree attention mask
// (each row sees its ancestors, the root and itself), and the verify-row order (canonical
// ascending slot at width >= 8, else deepest first then slot).
#include "speculative/draft_tree.h"

#include <gtest/gtest.h>

#include <vector>

#include "support/test_support.h"

namespace metrale::speculative {
namespace {

using test::error_of;
using Mask = std::vector<uint8_t>;

TEST(DraftTree, ChainIsALine) {
  const DraftTree t = DraftTree::chain(3);
  EXPECT_EQ(t.size(), 3);
  EXPECT_TRUE(t.is_chain());
  EXPECT_EQ(std::vector<int64_t>(t.parents().begin(), t.parents().end()),
            (std::vector<int64_t>{-1, 0, 1}));
  EXPECT_EQ(t.depth(0), 1);
  EXPECT_EQ(t.depth(2), 3);
  EXPECT_EQ(t.max_depth(), 3);
  // A chain's mask is causal: lower triangular over root + 3 rows.
  EXPECT_EQ(t.attention_mask(), (Mask{1, 0, 0, 0,  //
                                      1, 1, 0, 0,  //
                                      1, 1, 1, 0,  //
                                      1, 1, 1, 1}));
  EXPECT_EQ(DraftTree::parse("chain:3").parents().size(), 3u);
}

TEST(DraftTree, BranchingTreeMaskHoldsAncestorsOnly) {
  const DraftTree t = DraftTree::parse("-1,-1,0,0,1");
  EXPECT_FALSE(t.is_chain());
  EXPECT_EQ(t.max_depth(), 2);
  EXPECT_EQ(t.children(-1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(t.children(0), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.children(4), (std::vector<int64_t>{}));
  EXPECT_EQ(t.attention_mask(), (Mask{1, 0, 0, 0, 0, 0,     // root
                                      1, 1, 0, 0, 0, 0,     // node 0
                                      1, 0, 1, 0, 0, 0,     // node 1
                                      1, 1, 0, 1, 0, 0,     // node 2 (below 0)
                                      1, 1, 0, 0, 1, 0,     // node 3 (below 0)
                                      1, 0, 1, 0, 0, 1}));  // node 4 (below 1)
}

TEST(DraftTree, MaskEqualsTheAncestorRelationOnADeepTree) {
  // A ternary tree of 40 nodes: three below the root, then three below each node in order.
  std::vector<int64_t> parents(40);
  for (int64_t i = 0; i < 40; ++i) parents[i] = i < 3 ? -1 : i / 3 - 1;
  const DraftTree t = DraftTree::from_parents(parents);
  const Mask m = t.attention_mask();
  const int64_t rows = t.size() + 1;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<uint8_t> want(rows, 0);
    want[0] = 1;
    for (int64_t n = r - 1; n >= 0; n = t.parent(n)) want[n + 1] = 1;
    for (int64_t c = 0; c < rows; ++c) EXPECT_EQ(m[r * rows + c], want[c]) << r << "," << c;
    if (r > 0) {
      int64_t ones = 0;
      for (int64_t c = 0; c < rows; ++c) ones += m[r * rows + c];
      EXPECT_EQ(ones, t.depth(r - 1) + 1);  // its depth's ancestors, the root, itself
    }
  }
}

TEST(DraftTree, MainDepthFollowsTheFirstChildren) {
  EXPECT_EQ(DraftTree::chain(3).main_depth(), 3);
  EXPECT_EQ(DraftTree::parse("-1,-1,0,0,1").main_depth(), 2);  // nodes 0, 2
  // The main chain ends where a first child has no children, however deep the tree is.
  EXPECT_EQ(DraftTree::parse("-1,-1,1,2").main_depth(), 1);
  EXPECT_EQ(DraftTree::parse("-1,0,0,1,3").main_depth(), 4);
}

TEST(DraftTree, RejectsBadShapes) {
  const auto err = [](const char* spec) { return error_of([&] { DraftTree::parse(spec); }); };
  EXPECT_NE(err("").find("--draft-tree: empty tree"), std::string::npos);
  EXPECT_NE(err("chain:0").find("--draft-tree: 'chain:0': chain length must be an integer in "
                                "1..128, found '0'"),
            std::string::npos);
  EXPECT_NE(err("chain:x").find("found 'x'"), std::string::npos);
  EXPECT_NE(err("chain:129").find("found '129'"), std::string::npos);
  EXPECT_NE(err("0").find("--draft-tree: node 0: parent must be -1 (the root) or an earlier node"),
            std::string::npos);
  EXPECT_NE(err("-1,0,2").find("node 2: parent must be -1 (the root) or an earlier node (0..1), "
                               "found 2"),
            std::string::npos);
  EXPECT_NE(err("-1,-2").find("node 1: parent must be"), std::string::npos);
  EXPECT_NE(err("-1,a").find("node 1: expected a parent index (-1 for the root), found 'a'"),
            std::string::npos);
  EXPECT_NE(err("-1,").find("node 1: expected a parent index"), std::string::npos);
  EXPECT_NE(err("-1, 0").find("found ' 0'"), std::string::npos);
  std::string big = "-1";
  for (int i = 1; i <= 128; ++i) big += "," + std::to_string(i - 1);
  EXPECT_NE(err(big.c_str()).find("more than 128 nodes"), std::string::npos);
  EXPECT_NE(error_of([] {
              DraftTree::from_parents(std::vector<int64_t>{});
            }).find("expected 1..128 nodes, found 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { DraftTree::chain(0); }).find("chain length must be in 1..128"),
            std::string::npos);
}

TEST(VerifyOrder, NarrowStepsGoDeepestFirstThenBySlot) {
  const std::vector<VerifyKey> keys = {{.slot = 5, .depth = 1},
                                       {.slot = 9, .depth = 3},
                                       {.slot = 2, .depth = 3},
                                       {.slot = 0, .depth = 0}};
  EXPECT_EQ(verify_order(keys), (std::vector<int64_t>{2, 1, 0, 3}));
  // A branching tree's rows: depth 2 nodes (2, 3, 4) first, then depth 1 (0, 1).
  EXPECT_EQ(verify_order(verify_keys(DraftTree::parse("-1,-1,0,0,1"))),
            (std::vector<int64_t>{2, 3, 4, 0, 1}));
}

TEST(VerifyOrder, WideStepsAreCanonicalAscendingSlot) {
  std::vector<VerifyKey> keys;
  for (int64_t i = 0; i < 8; ++i) keys.push_back({.slot = (i * 5) % 8, .depth = i % 3});
  const std::vector<int64_t> order = verify_order(keys);
  ASSERT_EQ(order.size(), 8u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(keys[order[i]].slot, int64_t(i));
  // Seven keys: still the narrow rule.
  keys.pop_back();
  const std::vector<int64_t> narrow = verify_order(keys);
  EXPECT_EQ(keys[narrow[0]].depth, 2);

  const std::vector<VerifyKey> dup = {{.slot = 1, .depth = 1}, {.slot = 1, .depth = 2}};
  EXPECT_NE(error_of([&] { verify_order(dup); }).find("slot 1 appears twice"), std::string::npos);
}

}  // namespace
}  // namespace metrale::speculative
