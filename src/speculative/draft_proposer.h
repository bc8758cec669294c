#pragma once
// The seam every drafter attaches to: a DraftProposer proposes draft tokens for a sequence, the
// target verifies them in one ragged step, and the proposer hears how many were accepted.
// Proposers keep whatever they need per sequence in a ProposerState of their own type (the
// n-gram proposer: the context and its n-gram index; an MTP drafter: its own KV pages), which
// the engine holds without knowing what is inside.
//
// The lifecycle, per sequence:
//   s = alloc_state()
//   prefill_drafter(s, prompt t_0..t_{P-1}, the target's hidden rows for positions 0..P-1)
//     or start_drafter(s, prompt): drafter prefill off (drafter_context.h) — no rows over the
//     prompt; a hidden-reading drafter's first row is propose's key P-1
//   loop:
//     drafts = propose(s, {last = t_P, hidden = the target's row that produced t_P (position
//                          P-1), position = P, n})           // drafts for positions P+1..P+n
//     (the target verifies [t_P, drafts] at positions P..P+n; a drafts are accepted, and the
//      bonus token b is the next `last`, at position P+a+1)
//     after_verify(s, a)
//     catchup(s, rows the drafter missed)                     // optional, see below
//   free_state(s)
// A step that drafts nothing for the sequence (the ladder turned drafting down) is
// propose(n = 0): the proposer records `last` and proposes nothing (after_verify(s, 0) follows).
//
// Keys: an MTP drafter's row for key k is computed from (embed(t_{k+1}), hidden_k) at RoPE
// position k + 1 and predicts t_{k+2}; prefill covers keys 0..P-2, propose's first row is key
// P-1. catchup's rows use the same numbering: row i is key first_key + i, its token t_{k+1}
// and its target hidden hidden_k. A proposer that reads no hidden states (needs_hidden() false)
// is given rows with n_rows == 0 and uses only the tokens.
//
// The public calls validate their arguments once and keep the bookkeeping every proposer
// shares (the owner of a state, the drafts awaiting verification); proposers implement the
// protected do_* calls.
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/rows.h"
#include "speculative/draft_tree.h"

namespace metrale::speculative {

class DraftProposer;

// One sequence's drafter state. Proposers derive their own type from it; the engine only holds
// it. Not copyable: it may own pages of a pool.
class ProposerState {
 public:
  ProposerState() = default;
  ProposerState(const ProposerState&) = delete;
  ProposerState& operator=(const ProposerState&) = delete;
  virtual ~ProposerState() = default;

  // Drafts of the last propose() not yet answered by after_verify() (-1: none outstanding).
  int64_t outstanding() const { return outstanding_; }
  // The position the next propose() expects `last` at (the context length the proposer
  // holds), or -1 before prefill_drafter().
  int64_t next_position() const { return next_position_; }
  // The first key a hidden-reading proposer holds a row for: 0 after prefill_drafter(), P - 1
  // after start_drafter() (its rows are keys first_key() .. next_position() - 2), -1 before
  // either. A proposer that reads no hiddens keeps the whole context either way: 0.
  int64_t first_key() const { return first_key_; }

 private:
  friend class DraftProposer;
  const DraftProposer* owner_ = nullptr;
  int64_t outstanding_ = -1;
  int64_t next_position_ = -1;
  int64_t first_key_ = -1;
  int64_t last_position_ = -1;  // the position of the last propose()'s `last`
};

struct ProposeArgs {
  ProposerState* state = nullptr;
  int32_t last = 0;      // the token the target produced last, at `position`
  ConstRows hidden;      // the target's hidden row that produced `last` (1 row, or 0 rows)
  int64_t position = 0;  // `last`'s position in the sequence
  int64_t n = 0;         // drafts wanted (>= 0); a proposer may return fewer
};

// Rows the drafter missed (tokens decoded without it, or the accepted span's exact hiddens):
// row i is key first_key + i: the token t_{first_key+i+1} and the target's hidden at position
// first_key + i.
struct CatchupRows {
  int64_t first_key = 0;
  std::span<const int32_t> ids;
  ConstRows hidden;  // ids.size() rows, or 0 rows for a proposer that reads no hiddens
};

// One sequence's draft tree (draft_tree.h): node i's token and its parent (-1: the root, the
// `last` token), parents first. A node's children are in rank order — the first is the
// proposer's best guess — so the first children from the root form the main chain: the drafts
// propose() gives. Siblings never share a token.
struct TreeDrafts {
  std::vector<int32_t> tokens;
  std::vector<int64_t> parents;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  void clear() {
    tokens.clear();
    parents.clear();
  }
  // The nodes of the main chain, root-down.
  std::vector<int64_t> main_chain() const;
};

// Fills `out` along `shape`: node k of the shape, the c-th child of its parent, asks
// guess(parent's handle, c) for its token and handle (a token < 0: none, and the node is left
// out with its subtree); the root's handle is `root`. Nodes deeper than max_depth are left out.
// Proposers keep what a handle means (a trie node, a drafter row).
struct TreeGuess {
  int32_t token = -1;
  int64_t handle = 0;
};
template <typename Guess>
void fill_tree(const DraftTree& shape, int64_t max_depth, int64_t root, Guess&& guess,
               TreeDrafts& out) {
  out.clear();
  std::vector<int64_t> node_of(static_cast<size_t>(shape.size()), -1);  // shape -> out node
  std::vector<int64_t> handle_of;
  std::vector<int64_t> rank(static_cast<size_t>(shape.size()) + 1, 0);  // children seen, by parent
  for (int64_t k = 0; k < shape.size(); ++k) {
    const int64_t p = shape.parent(k);
    const int64_t c = rank[static_cast<size_t>(p + 1)]++;
    if (shape.depth(k) > max_depth) continue;
    const int64_t op = p < 0 ? -1 : node_of[static_cast<size_t>(p)];
    if (p >= 0 && op < 0) continue;  // its parent was left out
    const TreeGuess g = guess(op < 0 ? root : handle_of[static_cast<size_t>(op)], c);
    if (g.token < 0) continue;
    node_of[static_cast<size_t>(k)] = out.size();
    out.tokens.push_back(g.token);
    out.parents.push_back(op);
    handle_of.push_back(g.handle);
  }
}

class DraftProposer {
 public:
  DraftProposer() = default;
  DraftProposer(const DraftProposer&) = delete;
  DraftProposer& operator=(const DraftProposer&) = delete;
  virtual ~DraftProposer() = default;

  // "ngram", "mtp": the name errors and metrics use.
  virtual std::string_view name() const = 0;
  // Whether the proposer reads the target's hidden states; those that do are handed rows of
  // hidden_size() columns, the others rows with n_rows == 0.
  virtual bool needs_hidden() const = 0;
  virtual int64_t hidden_size() const { return 0; }

  std::unique_ptr<ProposerState> alloc_state();
  // The prompt t_0..t_{P-1} (P >= 1) and, for a proposer that needs them, the target's P
  // hidden rows. Once per state, before the first propose().
  void prefill_drafter(ProposerState& state, std::span<const int32_t> prompt, ConstRows hidden);
  // Drafter prefill off: the same start over `prompt`, without computing rows over it. A
  // hidden-reading proposer then holds no rows for keys 0..P-2 and attends only over the rows
  // it computes from propose's key P-1 on; one that reads no hiddens prefills as usual (it
  // reads the tokens only). Once per state, instead of prefill_drafter().
  void start_drafter(ProposerState& state, std::span<const int32_t> prompt);
  // Clears `drafts` and fills it with at most args.n drafts for positions position + 1 ...
  // A position below the proposer's context length rolls its context back to `position`
  // first (a rolled-back sequence); one above it is an error (catchup() first).
  void propose(const ProposeArgs& args, std::vector<int32_t>& drafts);
  // The same for many sequences at once (one state each, distinct); drafts[i] answers args[i].
  // Proposers without a batched form run one propose() per sequence.
  void propose_batch(std::span<const ProposeArgs> args, std::span<std::vector<int32_t>> drafts);
  // Tree drafting: out[i] gets a draft tree for args[i] whose nodes follow `shape` (fill_tree:
  // the c-th child of a node holds the proposer's c-th guess after its parent's path; a node it
  // has no guess for is left out with its subtree), at depth at most args[i].n. The main chain
  // is what propose() would draft, and counts as the drafts after_verify() answers: accepted is
  // how many of its nodes the verified path begins with. A path that leaves the main chain is
  // handed back by catchup() (the Speculator does it). Proposers without a tree of their own
  // draft the main chain only.
  void propose_tree_batch(std::span<const ProposeArgs> args, const DraftTree& shape,
                          std::span<TreeDrafts> out);
  // `accepted` (0 .. the last propose()'s draft count) of the state's drafts were accepted.
  void after_verify(ProposerState& state, int64_t accepted);
  // Appends rows the drafter missed; keys at or past the context's end, contiguous with it.
  void catchup(ProposerState& state, const CatchupRows& rows);
  // Releases what the state holds outside itself (pool pages); the state is unusable after.
  void free_state(ProposerState& state);

 protected:
  virtual std::unique_ptr<ProposerState> do_alloc_state() = 0;
  virtual void do_prefill(ProposerState& state, std::span<const int32_t> prompt,
                          ConstRows hidden) = 0;
  // start_drafter's: the default prefills a proposer that reads no hiddens and refuses one
  // that does (it must say where its rows start).
  virtual void do_start(ProposerState& state, std::span<const int32_t> prompt);
  virtual void do_propose(const ProposeArgs& args, std::vector<int32_t>& drafts) = 0;
  virtual void do_propose_batch(std::span<const ProposeArgs> args,
                                std::span<std::vector<int32_t>> drafts);
  // The default: do_propose_batch's chains (at most the shape's main-chain depth), on the
  // shape's main chain.
  virtual void do_propose_tree_batch(std::span<const ProposeArgs> args, const DraftTree& shape,
                                     std::span<TreeDrafts> out);
  // `drafted`: what the last propose() returned.
  virtual void do_after_verify(ProposerState& state, int64_t drafted, int64_t accepted) = 0;
  virtual void do_catchup(ProposerState& state, const CatchupRows& rows) = 0;
  virtual void do_free(ProposerState& /*state*/) {}

 private:
  void check_owned(const ProposerState& state, std::string_view call) const;
  void check_hidden(ConstRows hidden, int64_t rows, std::string_view call) const;
  void check_start(const ProposerState& state, std::span<const int32_t> prompt,
                   std::string_view call) const;
  void check_propose(const ProposeArgs& args) const;
  void after_propose(const ProposeArgs& args, std::vector<int32_t>& drafts) const;
};

}  // namespace metrale::speculative
