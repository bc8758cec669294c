#include "speculative/verify.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace metrale::speculative {
namespace {

int32_t first_argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

void check_rows(ConstRows r, int64_t rows, const char* what) {
  METRALE_CHECK(r.n_rows == rows, "verify: expected ", rows, " ", what, " rows, found ", r.n_rows);
  METRALE_CHECK(r.n_cols >= 1 && r.data != nullptr && r.stride >= r.n_cols, "verify: ", what,
                " rows: expected a vocabulary of at least 1 column, found ", r.n_cols);
}

void check_drafts(std::span<const int32_t> drafts, int64_t vocab) {
  for (size_t i = 0; i < drafts.size(); ++i) {
    METRALE_CHECK(drafts[i] >= 0 && drafts[i] < vocab, "verify: draft ", i, ": token ", drafts[i],
                  " outside the vocabulary 0..", vocab - 1);
  }
}

void check_probabilities(const float* p, int64_t n, const char* what, size_t row) {
  for (int64_t i = 0; i < n; ++i) {
    METRALE_CHECK(std::isfinite(p[i]) && p[i] >= 0.0f, "verify: ", what, " row ", row,
                  ": probability of token ", i, " is ", p[i], " (expected finite, >= 0)");
  }
}

// Inverse CDF over non-negative weights (computed by `w(i)`), in token order; u in [0, 1)
// scales by the actual total. -1 when every weight is 0.
template <typename W>
int32_t draw(int64_t n, float u, W w) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += w(i);
  if (total <= 0) return -1;
  const double target = static_cast<double>(u) * total;
  double cumulative = 0;
  int32_t last_positive = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double x = w(i);
    if (x <= 0) continue;
    cumulative += x;
    last_positive = static_cast<int32_t>(i);
    if (target < cumulative) return last_positive;
  }
  return last_positive;  // rounding ran off the end
}

}  // namespace

VerifyResult verify_greedy(std::span<const int32_t> drafts, ConstRows logits) {
  const auto n = static_cast<int64_t>(drafts.size());
  check_rows(logits, n + 1, "target logits");
  check_drafts(drafts, logits.n_cols);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t want = first_argmax(logits.row(i), logits.n_cols);
    if (drafts[static_cast<size_t>(i)] != want) return {.accepted = i, .next = want};
  }
  return {.accepted = n, .next = first_argmax(logits.row(n), logits.n_cols)};
}

VerifyResult verify_sampled(std::span<const int32_t> drafts, ConstRows target,
                            const ConstRows* draft, const UniformDraw& uniform) {
  const auto n = static_cast<int64_t>(drafts.size());
  check_rows(target, n + 1, "target probability");
  const int64_t vocab = target.n_cols;
  if (draft != nullptr) {
    check_rows(*draft, n, "draft probability");
    METRALE_CHECK(draft->n_cols == vocab, "verify: draft rows have ", draft->n_cols,
                  " columns, the target's ", vocab);
  }
  check_drafts(drafts, vocab);
  METRALE_CHECK(uniform != nullptr, "verify: no uniform draw");
  for (int64_t i = 0; i <= n; ++i) {
    const float* p = target.row(i);
    check_probabilities(p, vocab, "target", static_cast<size_t>(i));
    if (draft != nullptr && i < n)
      check_probabilities(draft->row(i), vocab, "draft", static_cast<size_t>(i));
  }

  for (int64_t i = 0; i < n; ++i) {
    const float* p = target.row(i);
    const float* q = draft != nullptr ? draft->row(i) : nullptr;
    const int32_t d = drafts[static_cast<size_t>(i)];
    const double pd = p[d];
    const double qd = q != nullptr ? q[d] : 1.0;
    METRALE_CHECK(qd > 0, "verify: draft ", i, ": token ", d,
                  " has draft probability 0 (a drafter cannot draft what it cannot draw)");
    // Accept with probability min(1, p/q): u < p / q, written without the division.
    const double u = uniform();
    if (u * qd < pd) continue;
    const float u2 = uniform();
    int32_t next = -1;
    if (q != nullptr) {
      next = draw(vocab, u2, [&](int64_t t) {
        return std::max(0.0, static_cast<double>(p[t]) - static_cast<double>(q[t]));
      });
    } else {
      next = draw(vocab, u2, [&](int64_t t) { return t == d ? 0.0 : static_cast<double>(p[t]); });
    }
    // The residual is empty only when p <= q everywhere, i.e. p == q up to rounding, where a
    // rejection has probability ~0; p itself is then the right distribution.
    if (next < 0) next = draw(vocab, u2, [&](int64_t t) { return static_cast<double>(p[t]); });
    METRALE_CHECK(next >= 0, "verify: target row ", i, " has no probability mass");
    return {.accepted = i, .next = next};
  }
  const float* p = target.row(n);
  const int32_t bonus =
      draw(vocab, uniform(), [&](int64_t t) { return static_cast<double>(p[t]); });
  METRALE_CHECK(bonus >= 0, "verify: target row ", n, " has no probability mass");
  return {.accepted = n, .next = bonus};
}

TreeVerifyResult verify_tree_greedy(const DraftTree& tree, std::span<const int32_t> tokens,
                                    ConstRows logits) {
  METRALE_CHECK(static_cast<int64_t>(tokens.size()) == tree.size(), "verify: the tree has ",
                tree.size(), " nodes, but ", tokens.size(), " draft tokens were given");
  check_rows(logits, tree.size() + 1, "target logits");
  check_drafts(tokens, logits.n_cols);
  TreeVerifyResult r;
  int64_t at = -1;  // the root
  for (;;) {
    const int32_t want = first_argmax(logits.row(at + 1), logits.n_cols);
    int64_t next_node = -1;
    // Children come after their parent in node order; the first child drafting `want` wins.
    for (int64_t c = at + 1; c < tree.size(); ++c) {
      if (tree.parent(c) == at && tokens[static_cast<size_t>(c)] == want) {
        next_node = c;
        break;
      }
    }
    if (next_node < 0) {
      r.next = want;
      return r;
    }
    r.path.push_back(next_node);
    at = next_node;
  }
}

int64_t drafter_trim(const TrimArgs& a) {
  METRALE_CHECK(a.drafted >= 0 && a.accepted >= 0 && a.accepted <= a.drafted,
                "drafter trim: accepted must be in 0..drafted, found ", a.accepted, " of ",
                a.drafted);
  if (a.exact) return std::max<int64_t>(a.drafted, 1) - 1;
  const int64_t rejected = a.drafted - a.accepted;
  const int64_t t = std::min(a.drafted, rejected + (a.refeed ? a.accepted - 1 : 0));
  return std::max<int64_t>(t, 0);
}

}  // namespace metrale::speculative
