#include "engine/speculation.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace metrale {
namespace {

using speculative::ProposeArgs;

// Pages `seq` must gain to hold `rows` more tokens (a shared page it writes into first
// becomes a private copy: one page more).
int64_t pages_needed(const KvPool& kv, const Sequence& seq, int64_t rows) {
  const int64_t page = kv.page_size();
  const auto have = static_cast<int64_t>(seq.tokens.size());
  const int64_t held = static_cast<int64_t>(seq.block_table.size());
  int64_t need = std::max<int64_t>((have + rows + page - 1) / page - held, 0);
  if (have % page != 0 && have / page < held &&
      kv.refs(seq.block_table[static_cast<size_t>(have / page)]) > 1) {
    ++need;
  }
  return need;
}

// The first child of row `row` among a tree step's rows (-1: none).
int64_t first_child(std::span<const int32_t> parents, int64_t row) {
  for (size_t c = static_cast<size_t>(row) + 1; c < parents.size(); ++c) {
    if (parents[c] == row) return static_cast<int64_t>(c);
  }
  return -1;
}

}  // namespace

Speculator::Speculator(Model& model, SpeculationOptions options)
    : model_(model), options_(std::move(options)), scratch_(model.vocab_size()) {
  if (!on()) return;
  speculative::check_dispatch_cap(options_.dispatch_cap, options_.ladder.num_drafts());
  const speculative::DraftProposer& p = *options_.proposer;
  METRALE_CHECK(!p.needs_hidden() || p.hidden_size() == model_.config().hidden_size,
                "speculative: the ", p.name(), " drafter reads hidden rows of ", p.hidden_size(),
                " values, but the model's hidden size is ", model_.config().hidden_size);
  METRALE_CHECK(!options_.tree.has_value() || options_.tree->size() <= options_.dispatch_cap,
                "--draft-tree: a tree of ", options_.tree.has_value() ? options_.tree->size() : 0,
                " nodes exceeds the dispatch cap of ", options_.dispatch_cap,
                " draft rows per step (--dispatch-cap)");
}

Speculator::~Speculator() = default;

bool Speculator::needs_hidden() const { return on() && options_.proposer->needs_hidden(); }

HiddenSink Speculator::sink_into(std::vector<float>& out, int64_t first_row) {
  const int64_t final_index = static_cast<int64_t>(model_.architecture().layers.size());
  const auto H = static_cast<size_t>(model_.config().hidden_size);
  return [&out, first_row, final_index, H](int64_t index, ConstRows h) {
    if (index != final_index) return;
    out.resize((static_cast<size_t>(first_row) + static_cast<size_t>(h.n_rows)) * H);
    for (int64_t r = 0; r < h.n_rows; ++r) {
      std::copy_n(h.row(r), H, out.data() + (static_cast<size_t>(first_row + r)) * H);
    }
  };
}

void Speculator::prefill(Sequence& seq, std::span<const int32_t> prompt,
                         std::span<float> last_logits) {
  if (!needs_hidden()) {
    model_.prefill(seq, prompt, last_logits);
    return;
  }
  // The final norm's rows are recorded for the rows that want logits: every prompt row.
  const auto V = static_cast<size_t>(model_.vocab_size());
  const auto n = static_cast<int64_t>(prompt.size());
  METRALE_CHECK(n > 0, "prefill: no tokens");
  METRALE_CHECK(last_logits.size() == V, "prefill: logits buffer holds ", last_logits.size(),
                " floats, expected ", V);
  METRALE_CHECK(!requires_single_chunk_prefill(model_.config()) || n <= model_.max_rows(),
                model_.config().model_type, " prompts must be prefilled in one chunk");
  // Drafter prefill off: the last row's only (the last chunk wants its last row's logits).
  const bool every_row = options_.drafter_prefill;
  prompt_hidden_.clear();
  for (int64_t done = 0; done < n; done += model_.max_rows()) {
    const int64_t rows = std::min(model_.max_rows(), n - done);
    const bool last = done + rows == n;
    const int64_t wanted = every_row ? rows : last ? 1 : 0;
    logits_.resize(static_cast<size_t>(wanted) * V);
    const StepItem item{.seq = &seq,
                        .ids = prompt.subspan(static_cast<size_t>(done), static_cast<size_t>(rows)),
                        .logits = every_row ? LogitRows::kAll
                                  : last    ? LogitRows::kLast
                                            : LogitRows::kNone};
    const HiddenSink sink = sink_into(prompt_hidden_, every_row ? done : 0);
    model_.step({&item, 1}, logits_, &sink);
    if (last) {
      std::copy_n(logits_.data() + static_cast<size_t>(wanted - 1) * V, V, last_logits.data());
    }
  }
  prompt_ids_.assign(prompt.begin(), prompt.end());
}

void Speculator::start(DecodeStream& s) {
  METRALE_CHECK(s.seq != nullptr && s.gen != nullptr, "speculative: a stream needs its sequence ",
                "and its generation");
  if (!on() || s.drafter != nullptr) return;
  ConstRows hidden{};
  if (needs_hidden()) {
    const std::span<const int32_t> context = s.seq->tokens;
    const int64_t H = model_.config().hidden_size;
    if (!options_.drafter_prefill) {
      // Only the last token's row is read: the last prefill must have ended the sequence.
      METRALE_CHECK(!prompt_ids_.empty() && !prompt_hidden_.empty() &&
                        context.size() >= prompt_ids_.size() &&
                        std::equal(prompt_ids_.begin(), prompt_ids_.end(),
                                   context.end() - static_cast<ptrdiff_t>(prompt_ids_.size())),
                    "speculative: the ", options_.proposer->name(), " drafter needs the target's ",
                    "hidden row of the context's last token; the last prefill did not end it");
      hidden = rows_of(prompt_hidden_.data(), 1, H);
    } else {
      METRALE_CHECK(
          std::equal(context.begin(), context.end(), prompt_ids_.begin(), prompt_ids_.end()),
          "speculative: the ", options_.proposer->name(), " drafter needs the target's hidden ",
          "rows of the whole context (", context.size(), " tokens); the last prefill recorded ",
          prompt_ids_.size(), " (a continued conversation cannot speculate with it yet)");
      hidden = rows_of(prompt_hidden_.data(), static_cast<int64_t>(context.size()), H);
    }
  }
  start(s, hidden);
}

void Speculator::start(DecodeStream& s, ConstRows hidden) {
  METRALE_CHECK(s.seq != nullptr && s.gen != nullptr, "speculative: a stream needs its sequence ",
                "and its generation");
  if (!on() || s.drafter != nullptr) return;
  const std::span<const int32_t> context = s.seq->tokens;
  speculative::DraftProposer& p = *options_.proposer;
  const bool prefill = options_.drafter_prefill;
  if (p.needs_hidden()) {
    const int64_t H = model_.config().hidden_size;
    METRALE_CHECK(
        (prefill ? hidden.n_rows == static_cast<int64_t>(context.size()) : hidden.n_rows >= 1) &&
            hidden.n_cols == H,
        "speculative: the ", p.name(), " drafter needs one hidden row of ", H,
        " values per context token (", context.size(),
        prefill ? "" : "; without drafter prefill, the last one", "); given ", hidden.n_rows,
        " rows of ", hidden.n_cols);
    s.last_hidden.assign(hidden.row(hidden.n_rows - 1), hidden.row(hidden.n_rows - 1) + H);
  } else {
    hidden = {};
  }
  s.drafter = p.alloc_state();
  if (prefill)
    p.prefill_drafter(*s.drafter, context, hidden);
  else
    p.start_drafter(*s.drafter, context);
}

std::unique_ptr<speculative::ProposerState> Speculator::take(DecodeStream& s, int64_t& last_key) {
  last_key = -1;
  if (s.drafter == nullptr) return nullptr;
  abandon(s);
  s.ids.clear();
  // After after_verify and the catch-up of the accepted span (finish() does both, also on
  // the step that ends the stream), the drafter holds keys 0 .. next_position - 2.
  // Started without drafter prefill, it holds keys from P - 1 only: nothing a carry can extend.
  last_key = s.drafter->first_key() == 0 ? s.drafter->next_position() - 2 : -1;
  return std::move(s.drafter);
}

void Speculator::adopt(DecodeStream& s, std::unique_ptr<speculative::ProposerState> state,
                       int64_t first_key, ConstRows hidden) {
  METRALE_CHECK(needs_hidden() && state != nullptr && s.drafter == nullptr,
                "speculative: adopt: a carried state for a hidden-reading drafter, to a stream "
                "without one");
  const std::span<const int32_t> context = s.seq->tokens;
  const auto P = static_cast<int64_t>(context.size());
  const int64_t H = model_.config().hidden_size;
  METRALE_CHECK(first_key >= 0 && first_key <= P - 1 && hidden.n_rows == P - first_key &&
                    hidden.n_cols == H && first_key + 1 <= state->next_position(),
                "speculative: adopt: keys from ", first_key, " of a ", P, "-token context, given ",
                hidden.n_rows, " hidden rows of ", hidden.n_cols, " and a state of ",
                state->next_position(), " tokens");
  speculative::DraftProposer& p = *options_.proposer;
  if (P - 1 > first_key) {
    p.catchup(*state, {.first_key = first_key,
                       .ids = context.subspan(static_cast<size_t>(first_key + 1)),
                       .hidden = {hidden.data, P - 1 - first_key, H, hidden.stride}});
  }
  // (With nothing to append, the first propose at position P drops the rows past key P - 2.)
  s.last_hidden.assign(hidden.row(hidden.n_rows - 1), hidden.row(hidden.n_rows - 1) + H);
  s.drafter = std::move(state);
}

ConstRows Speculator::prompt_hidden() const {
  if (prompt_hidden_.empty() || !options_.drafter_prefill) return {};
  return rows_of(prompt_hidden_.data(), static_cast<int64_t>(prompt_ids_.size()),
                 model_.config().hidden_size);
}

void Speculator::free(std::unique_ptr<speculative::ProposerState> state) {
  if (state != nullptr) options_.proposer->free_state(*state);
}

void Speculator::stop(DecodeStream& s) {
  if (s.drafter == nullptr) return;
  options_.proposer->free_state(*s.drafter);
  s.drafter.reset();
  s.ids.clear();
}

void Speculator::abandon(DecodeStream& s) {
  if (s.drafter != nullptr && s.drafter->outstanding() >= 0) {
    options_.proposer->after_verify(*s.drafter, 0);
  }
}

int64_t Speculator::draft_limit(const DecodeStream& s, int64_t active) const {
  const Generation& g = *s.gen;
  const auto have = static_cast<int64_t>(s.seq->tokens.size());
  int64_t n = options_.ladder.drafts_for(active);
  // A step emits accepted + 1 tokens: drafts past the stream's last token are never used.
  n = std::min(n, g.params().max_tokens - g.completion_tokens() - 1);
  const auto input = static_cast<int64_t>(g.input().size());
  if (g.params().max_input - input - 1 < n) n = g.params().max_input - input - 1;
  n = std::min(n, model_.context_limit() - have - 1);
  // The ring keeps the state after every row of a step of at most ring_depth + 1 rows.
  if (const StatePool* state = model_.state_pool(); state != nullptr) {
    n = std::min(n, state->plan().ring_depth);
  }
  return std::max<int64_t>(n, 0);
}

void Speculator::plan(std::span<DecodeStream* const> streams, int64_t max_draft_rows) {
  const auto active = static_cast<int64_t>(streams.size());
  for (DecodeStream* s : streams) {
    METRALE_CHECK(s->seq != nullptr && s->gen != nullptr && !s->gen->ended(),
                  "speculative: plan: a stream without a sequence, or one that ended");
    METRALE_CHECK(s->gen->input().size() == s->seq->tokens.size() + 1,
                  "speculative: plan: the sequence holds ", s->seq->tokens.size(),
                  " tokens, its generation's input ", s->gen->input().size(),
                  " (expected every accepted token but the last)");
    s->ids.assign(1, s->gen->input().back());
    s->parents.clear();
    s->proposed = 0;
    // A plan whose step never ran (a failed or rebuilt step) verified nothing.
    abandon(*s);
  }
  if (!on()) return;
  speculative::DraftProposer& p = *options_.proposer;
  const int64_t H = model_.config().hidden_size;
  // Streams without a drafter (not begun, or not speculating) decode their one row.
  args_.clear();
  drafting_.clear();
  for (DecodeStream* s : streams) {
    if (s->drafter == nullptr) continue;
    drafting_.push_back(s);
    args_.push_back(
        {.state = s->drafter.get(),
         .last = s->ids[0],
         .hidden = p.needs_hidden() ? rows_of(s->last_hidden.data(), 1, H) : ConstRows{},
         .position = static_cast<int64_t>(s->seq->tokens.size()),
         .n = draft_limit(*s, active)});
  }
  if (drafting_.empty()) return;
  const size_t n = drafting_.size();
  const bool tree = options_.tree.has_value();
  counts_.resize(n);
  if (tree) {
    trees_.resize(n);
    p.propose_tree_batch(args_, *options_.tree, std::span(trees_).first(n));
    for (size_t i = 0; i < n; ++i) counts_[i] = trees_[i].size();
  } else {
    proposed_.resize(n);
    p.propose_batch(args_, std::span(proposed_).first(n));
    for (size_t i = 0; i < n; ++i) counts_[i] = static_cast<int64_t>(proposed_[i].size());
  }
  for (size_t i = 0; i < n; ++i) drafting_[i]->proposed = counts_[i];
  speculative::fit_dispatch_cap(
      std::span(counts_).first(n),
      std::max<int64_t>(std::min(options_.dispatch_cap, max_draft_rows), 0));
  // The pages the drafts take must be free beside what every stream's own row needs.
  const KvPool& kv = model_.kv_pool();
  int64_t spare = kv.free_pages();
  for (DecodeStream* s : streams) spare -= pages_needed(kv, *s->seq, 1);
  for (size_t i = 0; i < n; ++i) {
    DecodeStream& s = *drafting_[i];
    const int64_t base = pages_needed(kv, *s.seq, 1);
    int64_t& k = counts_[i];
    // Hybrid models keep every tree row's state in the ring (StepItem::tree).
    if (const StatePool* state = model_.state_pool(); tree && state != nullptr)
      k = std::min(k, state->plan().ring_depth);
    while (k > 0 && pages_needed(kv, *s.seq, 1 + k) - base > spare) --k;
    spare -= pages_needed(kv, *s.seq, 1 + k) - base;
    if (!tree) {
      s.ids.insert(s.ids.end(), proposed_[i].begin(), proposed_[i].begin() + k);
      continue;
    }
    // The tree's first k nodes (parents come first, so they are a tree), below row 0.
    const speculative::TreeDrafts& t = trees_[i];
    s.ids.insert(s.ids.end(), t.tokens.begin(), t.tokens.begin() + k);
    s.parents.assign(1, -1);
    for (int64_t j = 0; j < k; ++j)
      s.parents.push_back(static_cast<int32_t>(t.parents[static_cast<size_t>(j)] + 1));
  }
}

void Speculator::finish(DecodeStream& s, std::span<float> logits, ConstRows hidden) {
  const auto V = static_cast<size_t>(model_.vocab_size());
  const auto rows = static_cast<int64_t>(s.ids.size());
  const int64_t n = rows - 1;
  METRALE_CHECK(rows >= 1 && logits.size() == static_cast<size_t>(rows) * V,
                "speculative: finish: ", logits.size(), " logits for ", rows, " rows");
  const auto have = static_cast<int64_t>(s.seq->tokens.size()) - rows;  // before the step
  METRALE_CHECK(have >= 0 && std::equal(s.ids.begin(), s.ids.end(), s.seq->tokens.end() - rows),
                "speculative: finish: the sequence does not end with the step's rows");
  Generation& g = *s.gen;
  const bool tree = !s.parents.empty();
  // Row i is picked as plain decoding picks it, after the drafts before it were accepted; the
  // next row is the one drafted after it (a chain's i + 1; in a tree, the child of row i whose
  // draft is the pick).
  path_.clear();  // the accepted rows after row 0
  bool ended_on_draft = false;
  for (int64_t i = 0;;) {
    const int32_t tok = g.pick(logits.subspan(static_cast<size_t>(i) * V, V), scratch_);
    g.accept(tok);
    int64_t next = -1;
    if (!tree) {
      if (i < n && tok == s.ids[static_cast<size_t>(i + 1)]) next = i + 1;
    } else {
      for (int64_t c = i + 1; c <= n && next < 0; ++c) {
        if (s.parents[static_cast<size_t>(c)] == i && s.ids[static_cast<size_t>(c)] == tok)
          next = c;
      }
    }
    if (next < 0) break;
    path_.push_back(next);
    i = next;
    if (g.ended()) {
      ended_on_draft = true;
      break;
    }
  }
  const auto accepted = static_cast<int64_t>(path_.size());
  // Keep t and the accepted drafts, but not one that ended the stream: plain decoding never
  // feeds the token that ends it.
  const int64_t kept = accepted - (ended_on_draft ? 1 : 0);
  if (tree) {
    keep_rows_.clear();
    for (int64_t j = 0; j < kept; ++j) keep_rows_.push_back(have + path_[static_cast<size_t>(j)]);
    model_.compact(*s.seq, have + 1, keep_rows_);
  } else {
    model_.truncate(*s.seq, have + 1 + kept);
  }
  if (n > 0) {
    ++s.counts.verify_steps;
    s.counts.drafted += n;
    s.counts.accepted += accepted;
    constexpr auto kAt = static_cast<int64_t>(SpeculationCounts::kPositions);
    // Draft positions are depths: a tree feeds several drafts at one.
    int64_t deepest = n;
    if (tree) {
      depth_.assign(static_cast<size_t>(rows), 0);
      deepest = 0;
      for (int64_t r = 1; r < rows; ++r) {
        depth_[static_cast<size_t>(r)] =
            depth_[static_cast<size_t>(s.parents[static_cast<size_t>(r)])] + 1;
        deepest = std::max(deepest, depth_[static_cast<size_t>(r)]);
      }
    }
    for (int64_t i = 0; i < std::min(deepest, kAt); ++i)
      ++s.counts.drafted_at[static_cast<size_t>(i)];
    for (int64_t i = 0; i < std::min(accepted, kAt); ++i)
      ++s.counts.accepted_at[static_cast<size_t>(i)];
  }
  if (s.drafter == nullptr) return;
  speculative::DraftProposer& p = *options_.proposer;
  // The drafter's own drafts are the main chain (a chain: all of them); the path begins with
  // `on_main` of them.
  int64_t on_main = 0;
  for (int64_t j = 0, at = 0; j < accepted; ++j) {
    const int64_t row = path_[static_cast<size_t>(j)];
    if (tree && first_child(s.parents, at) != row) break;
    ++on_main;
    at = row;
  }
  p.after_verify(*s.drafter, on_main);
  path_ids_.clear();
  for (const int64_t row : path_) path_ids_.push_back(s.ids[static_cast<size_t>(row)]);
  if (!p.needs_hidden()) {
    // A path that left the drafter's chain: the tokens it holds past the chain are not the ones
    // accepted.
    if (on_main < accepted) p.catchup(*s.drafter, {.first_key = have, .ids = path_ids_});
    return;
  }
  const int64_t H = model_.config().hidden_size;
  METRALE_CHECK(hidden.n_rows == rows && hidden.n_cols == H, "speculative: finish: ", hidden.n_rows,
                " hidden rows of ", hidden.n_cols, " for ", rows, " rows of ", H);
  // Key have + j reads the accepted token j + 1 and the hidden of the row before it on the path.
  const int64_t last_row = accepted > 0 ? path_.back() : 0;
  if (accepted > 0) {
    ConstRows path_hidden{hidden.data, accepted, H, hidden.stride};
    if (tree) {
      path_hidden_.resize(static_cast<size_t>(accepted * H));
      for (int64_t j = 0; j < accepted; ++j) {
        const int64_t row = j == 0 ? 0 : path_[static_cast<size_t>(j - 1)];
        std::copy_n(hidden.row(row), H, path_hidden_.data() + j * H);
      }
      path_hidden = rows_of(path_hidden_.data(), accepted, H);
    }
    p.catchup(*s.drafter, {.first_key = have, .ids = path_ids_, .hidden = path_hidden});
  }
  s.last_hidden.assign(hidden.row(last_row), hidden.row(last_row) + H);
}

void Speculator::step(std::span<DecodeStream* const> streams) {
  const auto V = static_cast<size_t>(model_.vocab_size());
  const auto max_rows = static_cast<size_t>(model_.max_rows());
  const int64_t H = model_.config().hidden_size;
  for (size_t b = 0; b < streams.size(); b += max_rows) {
    const std::span<DecodeStream* const> group =
        streams.subspan(b, std::min(streams.size() - b, max_rows));
    plan(group, static_cast<int64_t>(max_rows - group.size()));
    // The streams' rows in the verify order (speculative/draft_tree.h): below the canonical
    // width the deepest first, so the rows with the most to attend to start first; a stream's
    // result does not depend on where its rows sit in the step.
    keys_.clear();
    for (size_t i = 0; i < group.size(); ++i) {
      keys_.push_back({.slot = static_cast<int64_t>(i),
                       .depth = static_cast<int64_t>(group[i]->ids.size()) - 1});
    }
    const std::vector<int64_t> order = speculative::verify_order(keys_);
    ordered_.clear();
    for (const int64_t i : order) ordered_.push_back(group[static_cast<size_t>(i)]);
    items_.clear();
    size_t rows = 0;
    for (DecodeStream* s : ordered_) {
      items_.push_back(
          {.seq = s->seq, .ids = s->ids, .logits = LogitRows::kAll, .tree = s->parents});
      rows += s->ids.size();
    }
    logits_.resize(rows * V);
    hidden_.clear();
    const HiddenSink sink = sink_into(hidden_, 0);
    try {
      model_.step(items_, logits_, needs_hidden() ? &sink : nullptr);
    } catch (...) {
      for (DecodeStream* s : group) abandon(*s);
      throw;
    }
    size_t row = 0;
    for (DecodeStream* s : ordered_) {
      const size_t k = s->ids.size();
      const ConstRows hidden = needs_hidden()
                                   ? ConstRows{hidden_.data() + row * static_cast<size_t>(H),
                                               static_cast<int64_t>(k), H, H}
                                   : ConstRows{};
      finish(*s, std::span(logits_).subspan(row * V, k * V), hidden);
      row += k;
    }
  }
}

}  // namespace metrale
