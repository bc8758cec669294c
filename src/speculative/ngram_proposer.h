#pragma once
// Prompt lookup / n-gram drafting, for any model: the longest suffix of the context (prompt and
// generated tokens) of min_n..max_n tokens that occurred earlier in the context proposes the
// tokens that followed its most recent earlier occurrence, up to the draft count and the end
// of the context.
//
// The peers, read as the specification:
//  - vLLM's NgramProposer (vllm/v1/spec_decode/ngram_proposer.py,
//    _find_longest_matched_ngram_and_propose_tokens): the longest suffix n-gram in
//    [prompt_lookup_min, prompt_lookup_max], proposing up to k of the tokens that follow the
//    match, fewer when the context ends first; nothing when the context is shorter than
//    min_n. It rescans the whole context per call (KMP over the reversed tokens), and among
//    equally long matches takes the *earliest* occurrence.
//  - llama.cpp's n-gram drafting (common/ngram-map.cpp, common_ngram_simple_draft): a suffix
//    n-gram searched *backwards* from the end of the history, so the most recent occurrence
//    wins; it also rescans per call.
// This proposer takes vLLM's longest-match rule and llama.cpp's most-recent tie-break (a
// recent occurrence is the likelier continuation in edits and multi-turn copies), and keeps
// an index instead of rescanning: per n in min_n..max_n, a hash table from each n-gram to the
// most recent position it ends at, with a per-position link to the previous end of the same
// hash. Appending a token indexes max_n - min_n + 1 n-grams; a proposal probes at most that
// many tables and compares tokens exactly (a hash collision costs time, never a wrong draft);
// a rollback unlinks the positions it drops, newest first. Cost per token: O(max_n^2), not
// O(context).
//
// Trees (propose_tree_batch): the continuations of every earlier occurrence of the context's
// suffix, the longest n first and the most recent first within each n (at most
// kNgramTreeOccurrences), merged into a trie; a node's children rank in the order the trie
// first met them, so the main chain is the chain propose() drafts, and the branches are what
// followed the suffix at other places (an edit that went two ways, a list whose items share a
// start).
#include <cstdint>

#include "speculative/draft_proposer.h"

namespace metrale::speculative {

struct NgramOptions {
  int64_t min_n = 1;  // shortest suffix that may match (>= 1)
  int64_t max_n = 4;  // longest suffix tried first (min_n .. kNgramMaxN)
};

inline constexpr int64_t kNgramMaxN = 64;
inline constexpr int64_t kNgramTreeOccurrences = 64;

class NgramProposer final : public DraftProposer {
 public:
  // Throws when the options are outside their ranges, naming the field.
  explicit NgramProposer(const NgramOptions& options = {});

  std::string_view name() const override { return "ngram"; }
  bool needs_hidden() const override { return false; }
  const NgramOptions& options() const { return options_; }

  // The context the state holds (tests, debugging).
  static std::span<const int32_t> context(const ProposerState& state);

 protected:
  std::unique_ptr<ProposerState> do_alloc_state() override;
  void do_prefill(ProposerState& state, std::span<const int32_t> prompt, ConstRows) override;
  void do_propose(const ProposeArgs& args, std::vector<int32_t>& drafts) override;
  void do_propose_tree_batch(std::span<const ProposeArgs> args, const DraftTree& shape,
                             std::span<TreeDrafts> out) override;
  void do_after_verify(ProposerState& state, int64_t drafted, int64_t accepted) override;
  void do_catchup(ProposerState& state, const CatchupRows& rows) override;

 private:
  NgramOptions options_;
};

}  // namespace metrale::speculative
