#include "engine/mtp_proposer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "models/mtp_layers.h"
#include "speculative/verify.h"

namespace metrale {

using speculative::CatchupRows;
using speculative::ProposeArgs;
using speculative::ProposerState;

// One sequence's drafter rows: keys base..computed - 1 in the KV pages (key k at KV index
// k - base), then the rows recorded for the next propose (catch-up rows, a propose(n = 0)'s
// row) with their hidden inputs. base is 0 after a prefill and P - 1 after start_drafter (no
// rows over the prompt).
struct MtpProposer::State final : ProposerState {
  std::vector<int32_t> block_table;
  int64_t base = 0;
  int64_t computed = 0;
  std::vector<int32_t> pending_ids;   // key computed + i's token t_{k+1}
  std::vector<float> pending_hidden;  // [pending, H] its hidden row

  int64_t keys() const { return computed + static_cast<int64_t>(pending_ids.size()); }
};

namespace {

// The first maximum, as greedy sampling and verification pick.
int32_t first_argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

// The `ranks` best entries of v in descending order, ties to the lower index (so the first is
// first_argmax's), appended to `out`.
void append_best(const float* v, int64_t n, int64_t ranks, std::vector<int32_t>& out) {
  const size_t base = out.size();
  for (int64_t i = 0; i < n; ++i) {
    const auto have = static_cast<int64_t>(out.size() - base);
    if (have == ranks && !(v[i] > v[out.back()])) continue;
    if (have == ranks) out.pop_back();
    auto at = out.end();
    while (at != out.begin() + static_cast<ptrdiff_t>(base) && v[i] > v[*(at - 1)]) --at;
    out.insert(at, static_cast<int32_t>(i));
  }
}

}  // namespace

void MtpProposer::check_ids(std::span<const int32_t> ids, std::string_view call) const {
  for (const int32_t id : ids) {
    METRALE_CHECK(id < vocab_, "mtp proposer: ", call, ": token id ", id,
                  " is outside the vocabulary [0, ", vocab_, ")");
  }
}

int64_t mtp_kv_tokens(const Model& target, int64_t streams, int64_t drafts) {
  METRALE_CHECK(streams >= 1 && drafts >= 0, "mtp_kv_tokens: streams ", streams, " and drafts ",
                drafts, " (expected >= 1 and >= 0)");
  const KvPool& kv = target.kv_pool();
  const int64_t page = kv.page_size();
  return (kv.n_pages() + streams * ((drafts + page - 1) / page + 1)) * page;
}

std::unique_ptr<MtpProposer> MtpProposer::load(Model& target, const MtpOptions& o) {
  return with_context("loading the MTP drafter of " + target.dir().string(), [&] {
    const ModelConfig& c = target.config();
    METRALE_CHECK(o.kv_tokens >= 0 && o.page_size >= 0 && o.max_rows >= 0, "MtpOptions: kv_tokens ",
                  o.kv_tokens, ", page_size ", o.page_size, " and max_rows ", o.max_rows,
                  " must be >= 0 (0: the target's)");
    METRALE_CHECK(o.branch_min_prob >= 0.0f && o.branch_min_prob < 1.0f,
                  "MtpOptions: branch_min_prob must be in [0, 1), found ", o.branch_min_prob);
    std::unique_ptr<MtpProposer> p(new MtpProposer());
    p->branch_min_prob_ = o.branch_min_prob;
    p->target_ = &target;
    p->hidden_ = c.hidden_size;
    p->vocab_ = c.vocab_size;
    Backend& be = target.backend();
    p->checkpoint_ = std::make_unique<Checkpoint>(Checkpoint::open(target.dir()));
    {
      const QuantConfig quant = QuantConfig::parse(c.quantization_config_json, target.dir());
      TensorLoader loader(*p->checkpoint_, be, o.placement, nullptr);
      loader.set_quant_config(&quant);
      p->layer_ = load_mtp_layer(c, loader);
      p->storage_ = loader.take_storage();
    }
    const Mixer& mixer = p->layer_->layer().mixer();
    const KvShape shape = mixer.kv_shape();
    METRALE_CHECK(mixer.state_shape().empty() && !shape.empty(), p->layer_->prefix(),
                  ": an MTP layer must be an attention layer (", mixer.describe(), ")");
    const KvPool& tkv = target.kv_pool();
    const int64_t page = o.page_size > 0 ? o.page_size : tkv.page_size();
    const int64_t tokens = o.kv_tokens > 0 ? o.kv_tokens : tkv.n_pages() * tkv.page_size();
    p->kv_ = std::make_unique<KvPool>(be, (tokens + page - 1) / page, page,
                                      std::span<const KvShape>(&shape, 1), o.kv_dtype);
    p->kv_view_ = p->kv_->layer(0);
    p->context_ = target.context_limit();
    // Key k rotates at RoPE position k + 1: one row more than the target's table.
    p->rope_ = RopeTable::build(rope_table_config(c), p->context_ + 1);
    const RopeCache rope = p->rope_.cache();
    const auto rope_values = static_cast<size_t>(rope.n_positions * rope.rotary_dim / 2);
    p->rope_cos_ = DeviceFloats(be, {rope.cos, rope_values});
    p->rope_sin_ = DeviceFloats(be, {rope.sin, rope_values});

    const Architecture& arch = target.architecture();
    p->io_ = p->layer_->record(p->graph_, arch.embed, arch.lm_head);
    p->max_rows_ = o.max_rows > 0 ? o.max_rows : target.max_rows();
    p->plan_ = plan_graph(p->graph_, p->max_rows_);
    p->arena_ = be.allocate(std::max<size_t>(p->plan_.arena_bytes, 64));
    p->executor_ = std::make_unique<Executor>(p->graph_, p->plan_, p->arena_.data());

    const int64_t R = p->max_rows_, H = p->hidden_, stride = padded_cols(H);
    const auto block = static_cast<size_t>(R * stride);
    p->pass_buffer_ = be.allocate(5 * block * sizeof(float));
    auto* base = p->pass_buffer_.as<float>();
    p->hidden_in_ = {base, R, H, stride};
    p->h_ = {base + block, R, H, stride};
    p->delta_ = {base + 2 * block, R, H, stride};
    p->zeros_ = {base + 3 * block, R, H, stride};
    p->normed_ = {base + 4 * block, R, H, stride};
    be.zero(p->zeros_.data, block * sizeof(float));
    p->staging_.resize(block);
    p->logits_.resize(static_cast<size_t>(R * p->vocab_));
    p->executor_->bind(p->io_.hidden_in, p->hidden_in_.data, stride);
    p->executor_->bind(p->io_.h, p->h_.data, stride);
    p->executor_->bind(p->io_.delta, p->delta_.data, stride);
    if (p->io_.zeros >= 0) p->executor_->bind(p->io_.zeros, p->zeros_.data, stride);
    p->executor_->bind(p->io_.normed, p->normed_.data, stride);
    p->executor_->bind(p->io_.logits, p->logits_.data(), p->vocab_);
    const auto ur = static_cast<size_t>(R);
    for (auto* v :
         {&p->ids_, &p->positions_, &p->row_seq_, &p->row_index_, &p->want_, &p->injected_rows_})
      v->resize(ur);
    for (size_t i = 0; i < ur; ++i) p->row_index_[i] = static_cast<int32_t>(i);
    p->slots_.resize(ur);
    p->tables_.resize(ur);
    p->seqs_.resize(ur);
    return p;
  });
}

MtpProposer::~MtpProposer() = default;

int64_t MtpProposer::keys(const ProposerState& state) {
  const auto* s = dynamic_cast<const State*>(&state);
  METRALE_CHECK(s != nullptr, "mtp proposer: the state is not an MTP drafter's");
  return s->keys();
}

std::unique_ptr<ProposerState> MtpProposer::do_alloc_state() { return std::make_unique<State>(); }

void MtpProposer::run(std::span<const PassRow> rows) {
  const auto n = static_cast<int64_t>(rows.size());
  METRALE_CHECK(n > 0 && n <= max_rows_, "mtp proposer: a pass of ", n, " rows (1..", max_rows_,
                ")");
  const int64_t H = hidden_, V = vocab_, page = kv_->page_size(), stride = h_.stride;
  for (const PassRow& r : rows) {
    METRALE_CHECK(r.id >= 0 && r.id < V, "mtp proposer: token id ", r.id,
                  " is outside the vocabulary [0, ", V, ")");
    METRALE_CHECK(r.key >= 0 && r.key < context_, "mtp proposer: drafter row of key ", r.key,
                  " is outside the context of ", context_, " tokens");
  }
  // Each sequence's rows are consecutive and continue its KV: reserve their pages first.
  size_t n_seqs = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    State& s = *rows[r].state;
    if (r == 0 || &s != rows[r - 1].state) {
      METRALE_CHECK(rows[r].key == s.computed, "mtp proposer: rows of a sequence from key ",
                    rows[r].key, ", but it holds keys up to ", s.computed - 1);
      seqs_[n_seqs++] = &s;
    }
    if (r + 1 == rows.size() || rows[r + 1].state != &s)
      kv_->reserve(s.block_table, rows[r].key - s.base + 1);
  }
  int64_t n_want = 0, n_injected = 0;
  size_t seq = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const PassRow& row = rows[r];
    if (r > 0 && row.state != rows[r - 1].state) ++seq;
    if (r == 0 || row.state != rows[r - 1].state) {
      int64_t last = row.key;
      for (size_t q = r; q < rows.size() && rows[q].state == row.state; ++q) last = rows[q].key;
      tables_[seq] =
          KvPageTable{.block_table = row.state->block_table, .seq_len = last - row.state->base + 1};
    }
    // KV index and attention position key - base (the rotation shifts by -base with it, which
    // no score can tell: only position differences enter them).
    const int64_t index = row.key - row.state->base;
    ids_[r] = row.id;
    positions_[r] = static_cast<int32_t>(index);
    row_seq_[r] = static_cast<int32_t>(seq);
    slots_[r] = tables_[seq].slot(index, page);
    if (row.key == 0 && layer_->zero_first_key())
      injected_rows_[static_cast<size_t>(n_injected++)] = static_cast<int32_t>(r);
    if (row.want || trace_) want_[static_cast<size_t>(n_want++)] = static_cast<int32_t>(r);
    if (row.host != nullptr) {
      std::memcpy(staging_.data() + r * static_cast<size_t>(stride), row.host,
                  static_cast<size_t>(H) * sizeof(float));
    }
  }
  Backend& be = target_->backend();
  be.upload(hidden_in_.data, staging_.data(), static_cast<size_t>(n * stride) * sizeof(float));
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].device != nullptr) {
      be.copy(hidden_in_.row(static_cast<int64_t>(r)), rows[r].device,
              static_cast<size_t>(H) * sizeof(float));
    }
  }
  const auto un = static_cast<size_t>(n);
  const RopeCache table = rope_.cache();
  const int64_t half = table.rotary_dim / 2;
  const PassInputs in{
      .n_rows = n,
      .n_wanted = n_want,
      .ids = std::span(ids_).first(un),
      .positions = std::span(positions_).first(un),
      .row_index = std::span(row_index_).first(un),
      .n_injected = n_injected,
      .injected_rows = std::span(injected_rows_).first(static_cast<size_t>(n_injected)),
      .row_seq = std::span(row_seq_).first(un),
      .slots = std::span(slots_).first(un),
      .wanted = std::span(want_).first(static_cast<size_t>(n_want)),
      .seqs = std::span(tables_).first(n_seqs),
      // A row's attention position is its key (its KV index); it rotates at key + 1, the
      // table's next row.
      .rope = {rope_cos_.data() + half, rope_sin_.data() + half, table.rotary_dim,
               table.n_positions - 1},
      .kv = std::span<const KvLayerView>(&kv_view_, 1)};
  executor_->run(be, in);
  for (size_t i = 0; i < n_seqs; ++i) seqs_[i]->computed = seqs_[i]->base + tables_[i].seq_len;
  if (trace_) {  // every row wanted: wanted row r is pass row r
    for (size_t r = 0; r < rows.size(); ++r) {
      trace_(*rows[r].state, rows[r].key, logits_.data() + r * static_cast<size_t>(V),
             chained(static_cast<int64_t>(r), static_cast<int64_t>(r)));
    }
  }
}

const float* MtpProposer::chained(int64_t row, int64_t wanted) const {
  return layer_->chain_normed() ? normed_.row(wanted) : h_.row(row);
}

void MtpProposer::truncate(State& s, int64_t keys) {
  if (keys >= s.keys()) return;
  if (keys >= s.computed) {
    const auto keep = static_cast<size_t>(keys - s.computed);
    s.pending_ids.resize(keep);
    s.pending_hidden.resize(keep * static_cast<size_t>(hidden_));
    return;
  }
  s.pending_ids.clear();
  s.pending_hidden.clear();
  if (keys <= s.base) {  // nothing left: the next row starts the KV again
    kv_->release(s.block_table);
    s.base = keys;
  } else {
    kv_->truncate(s.block_table, keys - s.base);
  }
  s.computed = keys;
}

void MtpProposer::do_prefill(ProposerState& state, std::span<const int32_t> prompt,
                             ConstRows hidden) {
  State& s = static_cast<State&>(state);
  check_ids(prompt, "prefill_drafter");
  truncate(s, 0);  // what an earlier prefill that failed part-way computed
  // Keys 0..P-2 read (t_{k+1}, hidden_k); hidden row P - 1 comes back with the first propose.
  const auto P = static_cast<int64_t>(prompt.size());
  std::vector<PassRow> rows;
  for (int64_t k = 0; k + 1 < P; ++k) {
    rows.push_back(
        {.state = &s, .key = k, .id = prompt[static_cast<size_t>(k + 1)], .host = hidden.row(k)});
    if (static_cast<int64_t>(rows.size()) == max_rows_ || k + 2 == P) {
      run(rows);
      rows.clear();
    }
  }
}

void MtpProposer::do_start(ProposerState& state, std::span<const int32_t> prompt) {
  State& s = static_cast<State&>(state);
  check_ids(prompt, "start_drafter");
  // No rows over the prompt: the first is propose's key P - 1 (t_P, the prompt's last hidden).
  truncate(s, 0);
  s.base = s.computed = static_cast<int64_t>(prompt.size()) - 1;
}

void MtpProposer::do_catchup(ProposerState& state, const CatchupRows& rows) {
  State& s = static_cast<State&>(state);
  check_ids(rows.ids, "catchup");
  truncate(s, rows.first_key);
  METRALE_CHECK(rows.first_key == s.keys(), "mtp proposer: catchup from key ", rows.first_key,
                " leaves keys ", s.keys(), "..", rows.first_key - 1, " without drafter rows");
  const auto H = static_cast<size_t>(hidden_);
  for (size_t i = 0; i < rows.ids.size(); ++i) {
    s.pending_ids.push_back(rows.ids[i]);
    const float* h = rows.hidden.row(static_cast<int64_t>(i));
    s.pending_hidden.insert(s.pending_hidden.end(), h, h + H);
  }
}

void MtpProposer::do_propose(const ProposeArgs& args, std::vector<int32_t>& drafts) {
  do_propose_batch({&args, 1}, {&drafts, 1});
}

void MtpProposer::do_propose_batch(std::span<const ProposeArgs> args,
                                   std::span<std::vector<int32_t>> drafts) {
  const size_t m = args.size();
  const auto H = static_cast<size_t>(hidden_);
  std::vector<size_t> active;         // the sequences drafting, by args index
  std::vector<int64_t> wanted(m, 0);  // drafts each will make
  for (const ProposeArgs& a : args) check_ids({&a.last, 1}, "propose");
  for (size_t i = 0; i < m; ++i) {
    const ProposeArgs& a = args[i];
    State& s = static_cast<State&>(*a.state);
    const int64_t key = a.position - 1;
    truncate(s, key);  // a rolled-back sequence
    METRALE_CHECK(key == s.keys(), "mtp proposer: propose at position ", a.position,
                  " needs the drafter rows of keys ", s.keys(), "..", key - 1,
                  ", which it does not hold (catchup() the accepted drafts' target hiddens first)");
    s.pending_ids.push_back(a.last);
    s.pending_hidden.insert(s.pending_hidden.end(), a.hidden.row(0), a.hidden.row(0) + H);
    // Drafts for positions position + 1 .. position + n must stay inside the context.
    wanted[i] = std::clamp<int64_t>(a.n, 0, context_ - 1 - a.position);
    if (wanted[i] > 0) active.push_back(i);
  }
  if (active.empty()) return;
  Backend& be = target_->backend();
  const auto stride = static_cast<size_t>(h_.stride);
  if (chain_rows_ < static_cast<int64_t>(active.size())) {
    chain_ = be.allocate(active.size() * stride * sizeof(float));
    chain_rows_ = static_cast<int64_t>(active.size());
  }
  float* chain = chain_.as<float>();
  // Keeps what the pass computed for the wanted rows of active sequences: the draft, and the
  // output row the next draft chains on.
  std::vector<PassRow> rows;
  std::vector<size_t> row_active;  // rows[r]'s active index (wanted rows only)
  auto run_rows = [&] {
    if (rows.empty()) return;
    run(rows);
    int64_t w = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (!rows[r].want && !trace_) continue;
      const int64_t logit_row = w++;
      if (!rows[r].want) continue;
      const size_t ai = row_active[r];
      const float* row_logits = logits_.data() + logit_row * vocab_;
      drafts[active[ai]].push_back(first_argmax(row_logits, vocab_));
      if (ranks_ > 0) {
        std::vector<int32_t>& best = ranked_[active[ai]];
        const size_t first = best.size();
        append_best(row_logits, vocab_, ranks_, best);
        // Their probabilities: softmax over the row, in f64.
        const double top = row_logits[best[first]];
        double sum = 0;
        for (int64_t v = 0; v < vocab_; ++v) sum += std::exp(double{row_logits[v]} - top);
        for (size_t c = first; c < best.size(); ++c) {
          ranked_prob_[active[ai]].push_back(
              static_cast<float>(std::exp(double{row_logits[best[c]]} - top) / sum));
        }
      }
      be.copy(chain + ai * stride, chained(static_cast<int64_t>(r), logit_row), H * sizeof(float));
    }
    rows.clear();
    row_active.clear();
  };
  auto add = [&](const PassRow& row, size_t ai) {
    rows.push_back(row);
    row_active.push_back(ai);
    if (static_cast<int64_t>(rows.size()) == max_rows_) run_rows();
  };
  // First pass: every active sequence's recorded rows, the last one (key position - 1) wanted.
  // The rows read their hiddens from the states' pending lists, dropped once all ran (on an
  // error, those that ran, so keys() stays true).
  std::vector<int64_t> base(active.size());
  for (size_t ai = 0; ai < active.size(); ++ai)
    base[ai] = static_cast<State&>(*args[active[ai]].state).computed;
  auto drop_ran = [&] {
    for (size_t ai = 0; ai < active.size(); ++ai) {
      State& s = static_cast<State&>(*args[active[ai]].state);
      const auto ran = static_cast<size_t>(s.computed - base[ai]);
      s.pending_ids.erase(s.pending_ids.begin(), s.pending_ids.begin() + static_cast<long>(ran));
      s.pending_hidden.erase(s.pending_hidden.begin(),
                             s.pending_hidden.begin() + static_cast<long>(ran * H));
    }
  };
  try {
    for (size_t ai = 0; ai < active.size(); ++ai) {
      State& s = static_cast<State&>(*args[active[ai]].state);
      const size_t np = s.pending_ids.size();
      for (size_t j = 0; j < np; ++j) {
        add({.state = &s,
             .key = base[ai] + static_cast<int64_t>(j),
             .id = s.pending_ids[j],
             .host = s.pending_hidden.data() + j * H,
             .want = j + 1 == np},
            ai);
      }
    }
    run_rows();
  } catch (...) {
    drop_ran();
    throw;
  }
  drop_ran();
  // Chained drafts: one row per sequence still drafting, (previous draft, its own output).
  for (int64_t j = 1;; ++j) {
    bool any = false;
    for (size_t ai = 0; ai < active.size(); ++ai) {
      const size_t i = active[ai];
      if (wanted[i] <= j) continue;
      any = true;
      State& s = static_cast<State&>(*args[i].state);
      add({.state = &s,
           .key = s.computed,
           .id = drafts[i].back(),
           .device = chain + ai * stride,
           .want = true},
          ai);
    }
    if (!any) break;
    run_rows();
  }
}

void MtpProposer::do_propose_tree_batch(std::span<const speculative::ProposeArgs> args,
                                        const speculative::DraftTree& shape,
                                        std::span<speculative::TreeDrafts> out) {
  // The most children a main-chain node (or the root) has in the shape.
  auto ranks = static_cast<int64_t>(shape.children(-1).size());
  for (int64_t at = -1, k = 0; k < shape.size(); ++k) {
    if (shape.parent(k) != at) continue;
    at = k;
    ranks = std::max(ranks, static_cast<int64_t>(shape.children(k).size()));
  }
  std::vector<speculative::ProposeArgs> chain_args(args.begin(), args.end());
  for (speculative::ProposeArgs& a : chain_args) a.n = std::min(a.n, shape.main_depth());
  std::vector<std::vector<int32_t>> chains(args.size());
  ranks_ = std::max<int64_t>(ranks, 1);
  ranked_.assign(args.size(), {});
  ranked_prob_.assign(args.size(), {});
  try {
    do_propose_batch(chain_args, chains);
  } catch (...) {
    ranks_ = 0;
    throw;
  }
  ranks = ranks_;
  ranks_ = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::vector<int32_t>& best = ranked_[i];
    const std::vector<float>& prob = ranked_prob_[i];
    const auto rows = static_cast<int64_t>(chains[i].size());
    // Handle: the main-chain depth of the node (0: the root), or -1 off the main chain.
    speculative::fill_tree(
        shape, chain_args[i].n, 0,
        [&](int64_t depth, int64_t rank) {
          if (depth < 0 || depth >= rows || rank >= ranks) return speculative::TreeGuess{};
          if (rank > 0 && prob[static_cast<size_t>(depth * ranks + rank)] < branch_min_prob_)
            return speculative::TreeGuess{};
          return speculative::TreeGuess{.token = best[static_cast<size_t>(depth * ranks + rank)],
                                        .handle = rank == 0 ? depth + 1 : -1};
        },
        out[i]);
  }
}

void MtpProposer::do_after_verify(ProposerState& state, int64_t drafted, int64_t accepted) {
  State& s = static_cast<State&>(state);
  // Exact mode: only the row computed from the target's hidden (key position - 1) stays; the
  // accepted drafts' rows come back through catchup() with the target's own hiddens.
  const int64_t trim =
      speculative::drafter_trim({.drafted = drafted, .accepted = accepted, .exact = true});
  truncate(s, s.keys() - trim);
}

void MtpProposer::do_free(ProposerState& state) {
  State& s = static_cast<State&>(state);
  kv_->release(s.block_table);
  s.pending_ids.clear();
  s.pending_hidden.clear();
  s.base = s.computed = 0;
}

}  // namespace metrale
