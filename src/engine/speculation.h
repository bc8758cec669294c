#pragma once
// Speculative decoding in the engine: the one place where a stream's drafts are proposed, the
// verify rows are laid out, the target's rows are verified through the stream's Generation, and
// the rejected rows are rolled back. Session, generate_batch (and the server's Scheduler) decode
// through it; with no proposer it is plain decoding, one row per stream.
//
// A stream that last accepted token t (not yet fed) at position P, with drafts d_1..d_n, adds
// the rows [t, d_1..d_n] at positions P..P+n to one ragged step, asking logits for all of them.
// Row i is the target's prediction after d_1..d_i. Verification walks the rows through the
// stream's own Generation: row i is picked exactly as a plain decode step would pick it (the
// penalties, logit_bias, the processors, the greedy argmax or a draw from the stream's Rng);
// while the pick equals d_{i+1} the draft is accepted and the walk goes on, and the first pick
// that differs (or the last row's, the bonus) is accepted too and ends the step. So every step
// emits accepted + 1 tokens, and:
//  - greedy: the longest prefix of drafts equal to the target's argmax, then the correction or
//    the bonus (speculative/verify.h's verify_greedy, with the stream's penalties and bias);
//  - sampled: the drafts of a deterministic drafter (n-gram lookup, an MTP argmax: q one-hot at
//    the draft) are verified by speculative sampling, which for a one-hot q reduces to "draw x
//    from p_i; accept the draft iff x == d_{i+1}, else emit x": the draft is accepted with
//    probability p_i(d) = min(1, p_i(d) / q_i(d)), and a rejection emits x ~ p_i restricted to
//    x != d, normalised — the residual norm(max(0, p_i - q_i)) of verify_sampled. The output
//    is distributed as the target's, and since each emitted token costs exactly the draws its
//    plain pick costs, a seeded stream gives the same tokens with and without speculation.
//    (A drafter that samples its drafts from a distribution q would need verify_sampled's
//    general form; DraftProposer hands over tokens only, so none does yet.)
//
// Trees (SpeculationOptions::tree): the rows are t and the tree's nodes, each seeing only its
// ancestors; the walk starts at t's row, picks as above, and goes on into the child whose draft
// equals the pick (siblings never share one), so the emitted tokens are again exactly the plain
// picks — greedy and seeded sampling alike. The accepted path is then compacted to follow t
// (Model::compact), and the drafter hears it: after_verify with the main chain's accepted
// nodes, catchup with the path.
//
// Rollback: the sequence then keeps t, the accepted drafts, and nothing of the rows after them
// (Model::truncate: KV pages go back to the pool; a hybrid model's recurrent state comes from
// the state pool's ring, which keeps the state after every row of a step of at most
// ring_depth + 1 rows — so a hybrid model drafts at most ring_depth tokens per step). The token
// the step emitted last is fed by the next step, as in plain decoding, so the sequence always
// holds what the same stream decoded without speculation would hold.
//
// Drafts per stream: the ladder's count for the number of streams decoding together, then at
// most the tokens the stream may still emit minus one, the context left, the ring depth, the
// pages the KV pool has free; over a step the dispatch cap and max_rows bound the draft rows
// (fit_dispatch_cap shares them out evenly).
//
// Proposers that read the target's hidden states (needs_hidden()) get the final-norm hidden
// rows: the prompt's at prefill_drafter (the prefill then asks logits for every prompt row,
// which is what records them), the row that produced `last` at propose, and after
// after_verify(a) the accepted span's rows by catchup (keys P .. P + a - 1), so the drafter's
// rows for accepted drafts are the target's exact ones.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/generation.h"
#include "engine/model.h"
#include "speculative/draft_proposer.h"
#include "speculative/ladder.h"

namespace metrale {

struct SpeculationOptions {
  // nullptr: speculation off (one row per stream per step). Shared: one proposer serves every
  // stream (each has its own ProposerState).
  std::shared_ptr<speculative::DraftProposer> proposer;
  // Drafts per stream by the number of streams decoding together (its num_drafts: K).
  speculative::DraftLadder ladder = speculative::DraftLadder::constant(4);
  // Draft rows one step may add over all its streams (1..128).
  int64_t dispatch_cap = speculative::kDefaultDispatchCap;
  // Draft trees (speculative/draft_tree.h, `--draft-tree`): each stream drafts a tree of this
  // shape (DraftProposer::propose_tree_batch) no deeper than its draft count, verified in the
  // same one step with tree attention (StepItem::tree); the accepted path is compacted into
  // place (Model::compact). None: chains. Hybrid models: cut to the state ring's depth.
  std::optional<speculative::DraftTree> tree;
  // Drafter prefill (speculative/drafter_context.h): a hidden-reading drafter is prefilled over
  // the prompt's hidden rows. Off: it starts at the prompt's last key (start_drafter) and needs
  // only the last prompt row's hidden, so prefill() asks no logits but the last row's, a
  // continued conversation may speculate, and nothing is carried to a next turn.
  bool drafter_prefill = true;
};

// A stream's speculation figures.
struct SpeculationCounts {
  // Draft positions tallied one by one (drafted_at / accepted_at); deeper drafts count in the
  // totals only.
  static constexpr size_t kPositions = 8;
  int64_t verify_steps = 0;  // steps in which the stream had at least one draft
  int64_t drafted = 0;       // draft tokens fed to the target
  int64_t accepted = 0;      // of those, accepted
  // [i]: verify steps that fed draft i + 1, and those that accepted it (so drafts 1..i too):
  // accepted_at[i] / drafted_at[i] is the acceptance at draft position i + 1.
  std::array<int64_t, kPositions> drafted_at{}, accepted_at{};
  SpeculationCounts& operator+=(const SpeculationCounts& o) {
    verify_steps += o.verify_steps;
    drafted += o.drafted;
    accepted += o.accepted;
    for (size_t i = 0; i < kPositions; ++i) {
      drafted_at[i] += o.drafted_at[i];
      accepted_at[i] += o.accepted_at[i];
    }
    return *this;
  }
};

class Speculator;

// One stream decoding: its sequence (holding every token but the last accepted one) and its
// Generation, set by the caller; the rest is the Speculator's. Begun by Speculator::start,
// ended by Speculator::stop.
struct DecodeStream {
  Sequence* seq = nullptr;
  Generation* gen = nullptr;
  SpeculationCounts counts;

  // The Speculator's:
  std::unique_ptr<speculative::ProposerState> drafter;
  std::vector<int32_t> ids;        // this step's rows: the last accepted token, then the drafts
  std::vector<int32_t> parents;    // tree drafting: each row's parent row (-1: row 0); else empty
  std::vector<float> last_hidden;  // hidden-reading proposers: the row that produced `last`
  int64_t proposed = 0;            // drafts the proposer returned this step (before the caps)
};

class Speculator {
 public:
  // Validates the options (the dispatch cap, a hidden-reading proposer's hidden size).
  Speculator(Model& model, SpeculationOptions options);
  ~Speculator();
  Speculator(const Speculator&) = delete;
  Speculator& operator=(const Speculator&) = delete;

  bool on() const { return options_.proposer != nullptr; }
  const SpeculationOptions& options() const { return options_; }
  Model& model() { return model_; }
  // The picks' scratch (one per thread), for the caller's own picks.
  PickScratch& scratch() { return scratch_; }

  // Prefills `prompt` into `seq`; `last_logits` [V] receives the last row's logits. A
  // hidden-reading proposer needs the prompt's hidden rows: then every prompt row's logits are
  // computed (chunks of max_rows), and the rows kept for start() (drafter prefill off: the
  // last row's only).
  void prefill(Sequence& seq, std::span<const int32_t> prompt, std::span<float> last_logits);

  // Begins speculation for a stream whose prompt was prefilled and whose Generation accepted
  // the first token: its drafter is prefilled with the sequence's tokens. A hidden-reading
  // proposer needs the sequence to be exactly the last prefill()'s prompt (its hiddens); with
  // drafter prefill off, only to end with it (the last row's hidden).
  void start(DecodeStream& s);
  // The same with the target's final-norm hidden rows of the whole sequence given (one per
  // token of s.seq, [tokens, hidden]), for a caller that recorded them itself (the server,
  // over its prefill chunks); a proposer that reads no hiddens ignores them. Drafter prefill
  // off: any rows ending with the sequence's last token's (only that one is read).
  void start(DecodeStream& s, ConstRows hidden);
  // Frees the stream's drafter state (safe to call twice, and for a stream never started).
  void stop(DecodeStream& s);

  // MTP carry (speculative/mtp_carry.h). take(s): the stream's drafter state, out of the
  // stream and not freed (nullptr when it has none), with `last_key` the last drafter key it
  // holds (keys 0..last_key, every row computed from the target's own hiddens; -1: none, or a
  // state started without drafter prefill, whose rows do not begin at key 0).
  std::unique_ptr<speculative::ProposerState> take(DecodeStream& s, int64_t& last_key);
  // Begins `s` (as start()) with a carried drafter state whose keys 0..first_key - 1 hold for
  // the sequence's tokens: the rows past them are dropped and keys first_key .. P - 2 appended
  // from `hidden`, the target's final-norm rows of positions first_key .. P - 1 (P: the
  // sequence's tokens). Only for a hidden-reading proposer.
  void adopt(DecodeStream& s, std::unique_ptr<speculative::ProposerState> state, int64_t first_key,
             ConstRows hidden);
  // Frees a state take() returned.
  void free(std::unique_ptr<speculative::ProposerState> state);
  // The final-norm rows the last prefill() recorded ([its prompt's tokens, hidden]; empty for a
  // proposer that reads no hiddens), for a caller that adopt()s a carried state.
  ConstRows prompt_hidden() const;

  // One decode step for `streams` (unended; distinct sequences): proposes their drafts, runs
  // the verify rows (split into steps of at most max_rows rows), verifies and accepts through
  // each Generation, rolls back what was rejected. Tokens wait in each Generation for take().
  void step(std::span<DecodeStream* const> streams);

  // The pieces of step(), for a caller that builds its own ragged step (the server mixes
  // prefill chunks in): plan() proposes and caps the drafts of `streams` decoding together
  // (`max_draft_rows`: the rows the step has room for beyond one per stream) and sets each
  // stream's ids (its last token, then its drafts; a stream without a drafter — not begun,
  // or not speculating — has no drafts), to run with LogitRows::kAll; a stream's plan whose
  // step never ran is abandoned by the next plan(); finish(s)
  // verifies the step's `logits` of those rows ([ids.size(), V], rewritten by the picks) and
  // rolls back; `hidden`: the stream's final-norm hidden rows of the step for a
  // hidden-reading proposer (hidden_sink()), else 0 rows. A step that failed: abandon(s).
  void plan(std::span<DecodeStream* const> streams, int64_t max_draft_rows);
  void finish(DecodeStream& s, std::span<float> logits, ConstRows hidden);
  void abandon(DecodeStream& s);
  bool needs_hidden() const;
  // A HiddenSink that keeps the final norm's rows (index n_layers) in `out` from row
  // `first_row` on, [rows, hidden].
  HiddenSink sink_into(std::vector<float>& out, int64_t first_row);

 private:
  // The most drafts `s` may have in a step of `active` streams, before the step-wide caps.
  int64_t draft_limit(const DecodeStream& s, int64_t active) const;

  Model& model_;
  SpeculationOptions options_;
  PickScratch scratch_;
  std::vector<float> logits_;
  std::vector<float> hidden_;         // step()'s final-norm rows: [rows, hidden]
  std::vector<float> prompt_hidden_;  // prefill()'s, for start()
  std::vector<int32_t> prompt_ids_;
  std::vector<speculative::ProposeArgs> args_;
  std::vector<DecodeStream*> drafting_;  // plan()'s streams with a drafter
  std::vector<std::vector<int32_t>> proposed_;
  std::vector<speculative::TreeDrafts> trees_;
  std::vector<float> path_hidden_;  // finish(): a tree path's hidden rows, gathered
  std::vector<int64_t> path_;       // finish(): the accepted rows after row 0
  std::vector<int64_t> keep_rows_;  // finish(): the sequence's indices of the rows it keeps
  std::vector<int32_t> path_ids_;   // finish(): the accepted drafts
  std::vector<int64_t> depth_;      // finish(): a tree's rows' depths
  std::vector<int64_t> counts_;
  std::vector<StepItem> items_;
  std::vector<speculative::VerifyKey> keys_;  // step(): each stream's slot and draft rows
  std::vector<DecodeStream*> ordered_;        // step(): the streams in the verify order
};

}  // namespace metrale
