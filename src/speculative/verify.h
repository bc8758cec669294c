#pragma once
// Verifying drafts against the target, losslessly.
//
// The target runs the row of the last verified token and one row per draft in one step; its
// output row i is its prediction for the position after drafts[0..i). Verification accepts a
// prefix of the drafts and produces one more token, so every verify step emits accepted + 1
// tokens:
//  - greedy: a draft is accepted while it equals the target's argmax (the first maximum, as
//    the Sampler's greedy path picks); the next token is the argmax of the first row that
//    disagreed, or of the last row (the bonus) when all agreed. The output is token for token
//    what greedy decoding without speculation gives.
//  - sampled: speculative sampling (Leviathan, Kalman, Matias 2023, "Fast Inference from
//    Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023, "Accelerating Large
//    Language Model Decoding with Speculative Sampling"): draft d_i, drawn from the drafter's q_i,
//    is accepted with probability min(1, p_i(d_i) / q_i(d_i)); the first rejection draws the
//    next token from norm(max(0, p_i - q_i)); when every draft is accepted the bonus is drawn
//    from p_n. Each emitted token is then distributed exactly as the target's p (the proof:
//    q(x) min(1, p/q) + (1 - sum_y min(p, q)) max(0, p - q)(x) / sum_y max(0, p - q) = p(x)).
//    A drafter that drafts deterministically (n-gram lookup, an MTP argmax) has q one-hot at its
//    draft: pass no draft rows; acceptance is then p_i(d_i) and the residual is p_i without d_i.
//    p and q are the rows after the same processors sampling applies (temperature, top-k/p,
//    min-p), so the output follows the distribution the stream would sample from.
//
// After a verify step the MTP drafter trims the rows it computed for drafts (drafter_trim).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/rows.h"
#include "speculative/draft_tree.h"

namespace metrale::speculative {

struct VerifyResult {
  int64_t accepted = 0;  // drafts accepted: a prefix
  int32_t next = 0;      // the target's token after them (a correction, or the bonus)
};

// `logits`: drafts.size() + 1 rows of the vocabulary.
VerifyResult verify_greedy(std::span<const int32_t> drafts, ConstRows logits);

// One uniform draw in [0, 1) per call, from the stream's seeded generator.
using UniformDraw = std::function<float()>;

// `target`: drafts.size() + 1 probability rows (non-negative, finite, each summing to ~1);
// `draft`: drafts.size() rows of the drafter's probabilities, or nullptr for a deterministic
// drafter (one-hot at each draft). Draws at most drafts.size() + 1 uniforms. Throws on shapes
// that do not match, a probability row with a negative or non-finite entry, or a draft its
// drafter gave probability 0.
VerifyResult verify_sampled(std::span<const int32_t> drafts, ConstRows target,
                            const ConstRows* draft, const UniformDraw& uniform);

// Greedy verification of a draft tree, over raw argmaxes (the reference; the engine's walk,
// engine/speculation.h, picks each row through the stream's Generation, penalties and all):
// from the root, follow the child whose token is the target's argmax at the current row (the
// first such child when siblings repeat a token), until none is; `next` is the argmax there.
// `tokens[i]` is node i's draft, `logits` holds tree.size() + 1 rows (the root's, then node i's as
// row i + 1). `path` lists the accepted nodes, root-down: their rows are the ones whose KV the
// sequence keeps.
struct TreeVerifyResult {
  std::vector<int64_t> path;
  int32_t next = 0;
};
TreeVerifyResult verify_tree_greedy(const DraftTree& tree, std::span<const int32_t> tokens,
                                    ConstRows logits);

// How many of its rows a drafter trims after a verify step that accepted `accepted` of
// `drafted` drafts (rejected = drafted - accepted):
//   exact mode:  max(drafted, 1) - 1  (only the row computed from the target's own hidden
//                stays; catchup() refeeds the accepted span from the target's hiddens)
//   otherwise:   min(drafted, rejected + (refeed ? accepted - 1 : 0)), at least 0.
struct TrimArgs {
  int64_t drafted = 0;
  int64_t accepted = 0;
  bool exact = false;
  bool refeed = false;
};
int64_t drafter_trim(const TrimArgs& args);

}  // namespace metrale::speculative
