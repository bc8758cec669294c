#include "speculative/draft_proposer.h"

#include <unordered_set>

#include "core/error.h"

namespace metrale::speculative {

std::unique_ptr<ProposerState> DraftProposer::alloc_state() {
  std::unique_ptr<ProposerState> s = do_alloc_state();
  METRALE_CHECK(s != nullptr, name(), " proposer: alloc_state made no state");
  s->owner_ = this;
  return s;
}

void DraftProposer::check_owned(const ProposerState& state, std::string_view call) const {
  METRALE_CHECK(state.owner_ == this, name(), " proposer: ", call,
                ": the state is not one this proposer allocated (or it was freed)");
}

void DraftProposer::check_hidden(ConstRows hidden, int64_t rows, std::string_view call) const {
  if (!needs_hidden()) {
    METRALE_CHECK(hidden.n_rows == 0, name(), " proposer: ", call,
                  ": reads no hidden states, but was given ", hidden.n_rows, " rows");
    return;
  }
  METRALE_CHECK(hidden.n_rows == rows, name(), " proposer: ", call, ": expected ", rows,
                " hidden rows, found ", hidden.n_rows);
  METRALE_CHECK(rows == 0 || (hidden.data != nullptr && hidden.n_cols == hidden_size() &&
                              hidden.stride >= hidden.n_cols),
                name(), " proposer: ", call, ": expected hidden rows of ", hidden_size(),
                " columns, found ", hidden.n_cols, " (stride ", hidden.stride, ")");
}

void DraftProposer::check_start(const ProposerState& state, std::span<const int32_t> prompt,
                                std::string_view call) const {
  check_owned(state, call);
  METRALE_CHECK(state.next_position_ < 0, name(), " proposer: ", call,
                ": the state was already prefilled or started (", state.next_position_, " tokens)");
  METRALE_CHECK(!prompt.empty(), name(), " proposer: ", call, ": empty prompt");
  for (int32_t id : prompt) {
    METRALE_CHECK(id >= 0, name(), " proposer: ", call, ": token id must be >= 0, found ", id);
  }
}

void DraftProposer::prefill_drafter(ProposerState& state, std::span<const int32_t> prompt,
                                    ConstRows hidden) {
  check_start(state, prompt, "prefill_drafter");
  check_hidden(hidden, static_cast<int64_t>(prompt.size()), "prefill_drafter");
  do_prefill(state, prompt, hidden);
  state.next_position_ = static_cast<int64_t>(prompt.size());
  state.first_key_ = 0;
}

void DraftProposer::start_drafter(ProposerState& state, std::span<const int32_t> prompt) {
  check_start(state, prompt, "start_drafter");
  do_start(state, prompt);
  const auto P = static_cast<int64_t>(prompt.size());
  state.next_position_ = P;
  state.first_key_ = needs_hidden() ? P - 1 : 0;
}

void DraftProposer::do_start(ProposerState& state, std::span<const int32_t> prompt) {
  METRALE_CHECK(!needs_hidden(), name(),
                " proposer: start_drafter: drafting without a prefill over the prompt is not "
                "built for this proposer");
  do_prefill(state, prompt, {});
}

void DraftProposer::check_propose(const ProposeArgs& a) const {
  METRALE_CHECK(a.state != nullptr, name(), " proposer: propose: no state");
  const ProposerState& s = *a.state;
  check_owned(s, "propose");
  METRALE_CHECK(s.next_position_ >= 0, name(), " proposer: propose before prefill_drafter");
  METRALE_CHECK(s.outstanding_ < 0, name(), " proposer: propose: the previous ", s.outstanding_,
                " drafts await after_verify");
  METRALE_CHECK(a.n >= 0, name(), " proposer: propose: draft count must be >= 0, found ", a.n);
  METRALE_CHECK(a.last >= 0, name(), " proposer: propose: token id must be >= 0, found ", a.last);
  METRALE_CHECK(a.position >= 1 && a.position <= s.next_position_, name(),
                " proposer: propose: position ", a.position, " outside 1..", s.next_position_,
                " (the context it holds; catchup() the tokens it missed first)");
  check_hidden(a.hidden, 1, "propose");
}

void DraftProposer::after_propose(const ProposeArgs& a, std::vector<int32_t>& drafts) const {
  METRALE_CHECK(static_cast<int64_t>(drafts.size()) <= a.n, name(), " proposer: proposed ",
                drafts.size(), " drafts, at most ", a.n, " were asked for");
  a.state->outstanding_ = static_cast<int64_t>(drafts.size());
  a.state->last_position_ = a.position;
}

void DraftProposer::propose(const ProposeArgs& args, std::vector<int32_t>& drafts) {
  check_propose(args);
  drafts.clear();
  do_propose(args, drafts);
  after_propose(args, drafts);
}

void DraftProposer::propose_batch(std::span<const ProposeArgs> args,
                                  std::span<std::vector<int32_t>> drafts) {
  METRALE_CHECK(args.size() == drafts.size(), name(), " proposer: propose_batch: ", args.size(),
                " sequences but ", drafts.size(), " draft lists");
  std::unordered_set<const ProposerState*> seen;
  for (const ProposeArgs& a : args) {
    check_propose(a);
    METRALE_CHECK(seen.insert(a.state).second, name(),
                  " proposer: propose_batch: one state appears twice");
  }
  for (std::vector<int32_t>& d : drafts) d.clear();
  do_propose_batch(args, drafts);
  for (size_t i = 0; i < args.size(); ++i) after_propose(args[i], drafts[i]);
}

void DraftProposer::do_propose_batch(std::span<const ProposeArgs> args,
                                     std::span<std::vector<int32_t>> drafts) {
  for (size_t i = 0; i < args.size(); ++i) do_propose(args[i], drafts[i]);
}

std::vector<int64_t> TreeDrafts::main_chain() const {
  std::vector<int64_t> chain;
  int64_t at = -1;
  for (int64_t i = 0; i < size(); ++i) {
    if (parents[static_cast<size_t>(i)] != at) continue;
    chain.push_back(i);  // the first child of `at`: nodes come after their parent, in rank order
    at = i;
  }
  return chain;
}

void DraftProposer::propose_tree_batch(std::span<const ProposeArgs> args, const DraftTree& shape,
                                       std::span<TreeDrafts> out) {
  METRALE_CHECK(args.size() == out.size(), name(), " proposer: propose_tree_batch: ", args.size(),
                " sequences but ", out.size(), " trees");
  std::unordered_set<const ProposerState*> seen;
  for (const ProposeArgs& a : args) {
    check_propose(a);
    METRALE_CHECK(seen.insert(a.state).second, name(),
                  " proposer: propose_tree_batch: one state appears twice");
  }
  for (TreeDrafts& t : out) t.clear();
  do_propose_tree_batch(args, shape, out);
  for (size_t i = 0; i < args.size(); ++i) {
    const TreeDrafts& t = out[i];
    METRALE_CHECK(t.tokens.size() == t.parents.size() && t.size() <= shape.size(), name(),
                  " proposer: a draft tree of ", t.tokens.size(), " tokens and ", t.parents.size(),
                  " parents, for a shape of ", shape.size(), " nodes");
    std::vector<int64_t> depth(t.tokens.size());
    for (int64_t k = 0; k < t.size(); ++k) {
      const int64_t p = t.parents[static_cast<size_t>(k)];
      METRALE_CHECK(p >= -1 && p < k && t.tokens[static_cast<size_t>(k)] >= 0, name(),
                    " proposer: draft tree node ", k, " has parent ", p, " and token ",
                    t.tokens[static_cast<size_t>(k)]);
      depth[static_cast<size_t>(k)] = p < 0 ? 1 : depth[static_cast<size_t>(p)] + 1;
      METRALE_CHECK(depth[static_cast<size_t>(k)] <= args[i].n, name(), " proposer: draft tree ",
                    "node ", k, " at depth ", depth[static_cast<size_t>(k)], ", at most ",
                    args[i].n, " were asked for");
      for (int64_t j = 0; j < k; ++j) {
        METRALE_CHECK(t.parents[static_cast<size_t>(j)] != p ||
                          t.tokens[static_cast<size_t>(j)] != t.tokens[static_cast<size_t>(k)],
                      name(), " proposer: draft tree nodes ", j, " and ", k,
                      " are siblings with one token");
      }
    }
    args[i].state->outstanding_ = static_cast<int64_t>(t.main_chain().size());
    args[i].state->last_position_ = args[i].position;
  }
}

void DraftProposer::do_propose_tree_batch(std::span<const ProposeArgs> args, const DraftTree& shape,
                                          std::span<TreeDrafts> out) {
  const int64_t main_depth = shape.main_depth();
  std::vector<ProposeArgs> chain_args(args.begin(), args.end());
  for (ProposeArgs& a : chain_args) a.n = std::min(a.n, main_depth);
  std::vector<std::vector<int32_t>> chains(args.size());
  do_propose_batch(chain_args, chains);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::vector<int32_t>& c = chains[i];
    // Handle: the depth reached along the chain; only first children have a guess.
    fill_tree(
        shape, chain_args[i].n, 0,
        [&](int64_t depth, int64_t rank) {
          return rank == 0 && depth < static_cast<int64_t>(c.size())
                     ? TreeGuess{.token = c[static_cast<size_t>(depth)], .handle = depth + 1}
                     : TreeGuess{};
        },
        out[i]);
  }
}

void DraftProposer::after_verify(ProposerState& state, int64_t accepted) {
  check_owned(state, "after_verify");
  METRALE_CHECK(state.outstanding_ >= 0, name(),
                " proposer: after_verify without drafts awaiting verification");
  METRALE_CHECK(accepted >= 0 && accepted <= state.outstanding_, name(),
                " proposer: after_verify: accepted must be in 0..", state.outstanding_,
                " (the drafts proposed), found ", accepted);
  do_after_verify(state, state.outstanding_, accepted);
  state.next_position_ = state.last_position_ + accepted + 1;
  state.outstanding_ = -1;
}

void DraftProposer::catchup(ProposerState& state, const CatchupRows& rows) {
  check_owned(state, "catchup");
  METRALE_CHECK(state.next_position_ >= 0, name(), " proposer: catchup before prefill_drafter");
  METRALE_CHECK(state.outstanding_ < 0, name(), " proposer: catchup: ", state.outstanding_,
                " drafts await after_verify");
  METRALE_CHECK(!rows.ids.empty(), name(), " proposer: catchup: no rows");
  METRALE_CHECK(rows.first_key >= 0 && rows.first_key + 1 <= state.next_position_, name(),
                " proposer: catchup: first key ", rows.first_key, " outside 0..",
                state.next_position_ - 1, " (rows must continue the context it holds)");
  for (int32_t id : rows.ids) {
    METRALE_CHECK(id >= 0, name(), " proposer: catchup: token id must be >= 0, found ", id);
  }
  check_hidden(rows.hidden, static_cast<int64_t>(rows.ids.size()), "catchup");
  do_catchup(state, rows);
  state.next_position_ = rows.first_key + 1 + static_cast<int64_t>(rows.ids.size());
}

void DraftProposer::free_state(ProposerState& state) {
  check_owned(state, "free_state");
  do_free(state);
  state.owner_ = nullptr;
}

}  // namespace metrale::speculative
