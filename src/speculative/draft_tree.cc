#include "speculative/draft_tree.h"

#include <algorithm>
#include <charconv>
#include <numeric>
#include <string>
#include <unordered_set>

#include "core/error.h"

namespace metrale::speculative {

DraftTree DraftTree::chain(int64_t n) {
  METRALE_CHECK(n >= 1 && n <= kMaxTreeNodes, "draft tree: chain length must be in 1..",
                kMaxTreeNodes, ", found ", n);
  std::vector<int64_t> parents(static_cast<size_t>(n));
  std::iota(parents.begin(), parents.end(), int64_t{-1});
  return from_parents(parents);
}

DraftTree DraftTree::from_parents(std::span<const int64_t> parents) {
  const auto n = static_cast<int64_t>(parents.size());
  METRALE_CHECK(n >= 1 && n <= kMaxTreeNodes, "draft tree: expected 1..", kMaxTreeNodes,
                " nodes, found ", n);
  DraftTree t;
  t.parents_.assign(parents.begin(), parents.end());
  t.depths_.resize(parents.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = parents[static_cast<size_t>(i)];
    METRALE_CHECK(p >= -1 && p < i, "draft tree: node ", i, ": parent must be -1 (the root) or ",
                  "an earlier node (0..", i - 1, "), found ", p);
    t.depths_[static_cast<size_t>(i)] = p < 0 ? 1 : t.depths_[static_cast<size_t>(p)] + 1;
    t.max_depth_ = std::max(t.max_depth_, t.depths_[static_cast<size_t>(i)]);
  }
  return t;
}

DraftTree DraftTree::parse(std::string_view spec, std::string_view flag) {
  const auto number = [&](std::string_view s, int64_t& v) {
    if (s.empty() || s.size() > 18 || s.front() == '+') return false;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && end == s.data() + s.size();
  };
  constexpr std::string_view kChain = "chain:";
  if (spec.starts_with(kChain)) {
    int64_t k = 0;
    const std::string_view text = spec.substr(kChain.size());
    METRALE_CHECK(number(text, k) && k >= 1 && k <= kMaxTreeNodes, flag, ": '", spec,
                  "': chain length must be an integer in 1..", kMaxTreeNodes, ", found '", text,
                  "'");
    return chain(k);
  }
  METRALE_CHECK(!spec.empty(), flag, ": empty tree; expected \"chain:K\" or a parent list ",
                "such as \"-1,-1,0,0,1\"");
  std::vector<int64_t> parents;
  size_t start = 0;
  for (int64_t node = 0;; ++node) {
    const size_t comma = spec.find(',', start);
    const std::string_view item = spec.substr(start, comma - start);
    int64_t p = 0;
    METRALE_CHECK(number(item, p), flag, ": node ", node, ": expected a parent index (-1 for ",
                  "the root), found '", item, "'");
    METRALE_CHECK(p >= -1 && p < node, flag, ": node ", node, ": parent must be -1 (the root) ",
                  "or an earlier node (0..", node - 1, "), found ", p);
    parents.push_back(p);
    METRALE_CHECK(static_cast<int64_t>(parents.size()) <= kMaxTreeNodes, flag, ": more than ",
                  kMaxTreeNodes, " nodes");
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return from_parents(parents);
}

bool DraftTree::is_chain() const {
  for (int64_t i = 0; i < size(); ++i) {
    if (parent(i) != i - 1) return false;
  }
  return true;
}

int64_t DraftTree::main_depth() const {
  int64_t at = -1, depth = 0;
  for (int64_t k = 0; k < size(); ++k) {
    if (parent(k) != at) continue;
    at = k;  // the first child of the node before: children come after their parent, in order
    ++depth;
  }
  return depth;
}

std::vector<int64_t> DraftTree::children(int64_t node) const {
  std::vector<int64_t> c;
  for (int64_t i = std::max<int64_t>(node + 1, 0); i < size(); ++i) {
    if (parent(i) == node) c.push_back(i);
  }
  return c;
}

std::vector<uint8_t> DraftTree::attention_mask() const {
  const int64_t rows = size() + 1;
  std::vector<uint8_t> mask(static_cast<size_t>(rows * rows), 0);
  const auto at = [&](int64_t r, int64_t c) -> uint8_t& {
    return mask[static_cast<size_t>(r * rows + c)];
  };
  at(0, 0) = 1;
  for (int64_t i = 0; i < size(); ++i) {
    const int64_t r = i + 1;
    const int64_t pr = parent(i) + 1;  // the parent's row (0: the root)
    // A node sees what its parent sees, plus itself; parents come first, so the parent's
    // row is complete.
    for (int64_t c = 0; c < rows; ++c) at(r, c) = at(pr, c);
    at(r, r) = 1;
  }
  return mask;
}

std::vector<int64_t> verify_order(std::span<const VerifyKey> keys) {
  std::unordered_set<int64_t> slots;
  for (const VerifyKey& k : keys) {
    METRALE_CHECK(k.depth >= 0, "verify order: depth must be >= 0, found ", k.depth);
    METRALE_CHECK(slots.insert(k.slot).second, "verify order: slot ", k.slot, " appears twice");
  }
  std::vector<int64_t> order(keys.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  const auto key = [&](int64_t i) { return keys[static_cast<size_t>(i)]; };
  if (static_cast<int64_t>(keys.size()) >= kCanonicalVerifyWidth) {
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return key(a).slot < key(b).slot; });
  } else {
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      if (key(a).depth != key(b).depth) return key(a).depth > key(b).depth;
      return key(a).slot < key(b).slot;
    });
  }
  return order;
}

std::vector<VerifyKey> verify_keys(const DraftTree& tree) {
  std::vector<VerifyKey> k;
  k.reserve(static_cast<size_t>(tree.size()));
  for (int64_t i = 0; i < tree.size(); ++i) k.push_back({.slot = i, .depth = tree.depth(i)});
  return k;
}

}  // namespace metrale::speculative
