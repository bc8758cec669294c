#pragma once
// Draft trees: the shape of what one sequence drafts for one verify step. A chain of k drafts
// is the common case; a branching tree drafts several continuations at once (SpecInfer,
// Medusa/EAGLE's static trees) and is verified in the same single ragged step, each row seeing
// only the context and its own ancestors (engine/model.h StepItem::tree). attention_mask()
// states that relation; the attention ops realise it by reading a row's ancestors through
// backend.h's KeyRemap, at the positions the same path's chain gives them, which a mask over
// scattered keys would not (the kernels' sums group keys by index).
//
// A tree is a list of parents: node i (a draft row) hangs below parents[i], -1 being the root
// — the row of the sequence's last verified token, which the verify step runs first. Parents
// precede their children, so the list is a topological order and cannot hold a cycle. Node
// depths count from the root's children (depth 1); a node at depth d sits at position
// `root position + d`.
//
// Spec strings (--draft-tree): "chain:K" (K drafts in a line), or the parent list itself,
// e.g. "-1,-1,0,0,1" (two children of the root; two below the first, one below the second).
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace metrale::speculative {

inline constexpr int64_t kMaxTreeNodes = 128;  // the dispatch cap's ceiling

class DraftTree {
 public:
  static DraftTree chain(int64_t n);
  // Throws unless every parent is -1 or an earlier node, and there are 1..128 nodes.
  static DraftTree from_parents(std::span<const int64_t> parents);
  // Errors name `flag` and, for a parent list, the node (0-based) and what it held.
  static DraftTree parse(std::string_view spec, std::string_view flag = "--draft-tree");

  int64_t size() const { return static_cast<int64_t>(parents_.size()); }  // nodes (no root)
  int64_t parent(int64_t node) const { return parents_[static_cast<size_t>(node)]; }
  int64_t depth(int64_t node) const { return depths_[static_cast<size_t>(node)]; }
  int64_t max_depth() const { return max_depth_; }
  std::span<const int64_t> parents() const { return parents_; }
  bool is_chain() const;
  // The depth of the main chain: the first children from the root (a node's children rank in
  // node order, the first being a proposer's best guess).
  int64_t main_depth() const;
  // Children of `node` (-1: the root's), ascending.
  std::vector<int64_t> children(int64_t node) const;

  // The tree attention mask over the step's rows of this sequence: row 0 is the root, row
  // i + 1 node i; mask[r * (size() + 1) + c] is 1 when row r attends to row c — its
  // ancestors, the root and itself. Every row also attends to the whole context (the tokens
  // before the root), which is not part of the mask.
  std::vector<uint8_t> attention_mask() const;

 private:
  std::vector<int64_t> parents_;
  std::vector<int64_t> depths_;
  int64_t max_depth_ = 0;
};

// The order of a verify step's rows. A key is a row's slot (a tree node's index, or a
// sequence's slot in the batch) and its depth (how many rows before it it attends to within
// the step). Width = the number of keys. At width >= kCanonicalVerifyWidth the order is
// canonical: ascending slot, whatever the depths. Below it: deepest first (the rows with the
// most to attend to start first), ties by ascending slot. Returns indices into `keys`.
inline constexpr int64_t kCanonicalVerifyWidth = 8;

struct VerifyKey {
  int64_t slot = 0;
  int64_t depth = 0;
};

std::vector<int64_t> verify_order(std::span<const VerifyKey> keys);

// The keys of a tree's nodes: slot = node index, depth = its depth.
std::vector<VerifyKey> verify_keys(const DraftTree& tree);

}  // namespace metrale::speculative
