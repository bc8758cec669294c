// The engine thread's step (scheduler.h): admission, step building, paging and preemption,
// running the step, and post-processing each stream's rows (reports, ends).
#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <utility>

#include "engine/session.h"
#include "serve/scheduler.h"
#include "serve/scheduler_active.h"

namespace metrale {

int64_t Scheduler::decode_width(const Active& a) const {
  if (a.embeds()) return 0;  // an embedding input never grows past its input
  if (!a.speculative) return 1;
  int64_t drafts = spec_.options().ladder.num_drafts();
  if (spec_.options().tree.has_value()) drafts = spec_.options().tree->size();
  if (const StatePool* state = model_.state_pool(); state != nullptr) {
    drafts = std::min(drafts, state->plan().ring_depth);
  }
  return 1 + drafts;
}

void Scheduler::admit() {
  const int64_t page = model_.kv_pool().layout().page_size;
  auto pages = [page](int64_t tokens) { return (tokens + page - 1) / page; };
  for (;;) {
    ActivePtr a;
    {
      std::lock_guard lock(mu_);
      if (queue_.empty()) break;
      const Active& head = *queue_.front();
      // Streams and embedding inputs have their own limits; hybrid models hold a state slot
      // for each of either.
      const auto n_embed = static_cast<int64_t>(std::count_if(
          running_.begin(), running_.end(), [](const auto& r) { return r->embeds(); }));
      const auto n_running = static_cast<int64_t>(running_.size());
      if (head.embeds() ? n_embed >= options_.max_embedding_seqs
                        : n_running - n_embed >= options_.max_seqs)
        break;
      if (const StatePool* states = model_.state_pool();
          states != nullptr && n_running >= states->plan().max_seqs)
        break;
      // A stream preempted for pages waits for a step to run without it: re-admitted at
      // once, it would be preempted again by the same step, forever.
      if (head.preempted_at_step == counts_.steps) break;
      // Its input's pages and its first decode rows, plus the pages the running streams still
      // need for their inputs (a stream admitted but not yet prefilled holds none yet) and
      // headroom for their next decode rows (a page), so the step that follows can run. (An
      // embedding input has no decode rows: it never grows past its input.)
      int64_t need = pages(head.input_size() + decode_width(head));
      for (const auto& r : running_) {
        need += std::max<int64_t>(
                    0, pages(r->input_size()) - static_cast<int64_t>(r->seq.block_table.size())) +
                pages(decode_width(*r));
      }
      if (model_.kv_pool().free_pages() < need && cache_->make_room(need) < need) break;
      a = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      model_.set_adapter(a->seq, a->adapter);
    } catch (const Error& e) {
      retire(*a, FinishReason::kError, e.message());
      continue;
    }
    // An embedding needs the hidden state of every token it pools: a cached prefix only under
    // last-token pooling (the prefix cache always leaves the last token to run).
    // A hidden-reading drafter (MTP) is prefilled from the target's hidden state of every
    // prompt token, which a cached prefix does not keep: such a stream runs its whole input
    // (and still shares its pages with the cache for the others).
    // With the session's carried drafter rows adopted through key k, the hiddens are needed
    // from position k + 1 on only: a cached prefix of up to k + 1 tokens may be attached.
    // Without drafter prefill only the last prompt row's hidden is read: any cached prefix.
    const bool may_attach = !a->embeds() || options_.embedding->pooling == Pooling::kLastToken;
    const std::vector<int32_t> key = cache_key(*a);
    std::span<const int32_t> attachable = a->gen.input();
    if (a->reads_hidden) {
      const int64_t through = plan_carry(*a, !a->counted);
      if (drafter_prefill()) {
        attachable = attachable.first(static_cast<size_t>(through + 2 > 1 ? through + 2 : 0));
      } else {
        spec_.free(std::move(a->carried));
      }
    }
    const std::span<const int32_t> attach_key =
        key.empty() ? std::span<const int32_t>()
                    : std::span<const int32_t>(key).first(attachable.size());
    const int64_t adopted =
        may_attach && !attachable.empty() ? cache_->attach(a->seq, attachable, attach_key) : 0;
    if (a->mm != nullptr && !encode_media(*a, adopted)) continue;
    a->hidden_from = adopted;
    a->snapshot_points = cache_->snapshot_points(
        a->seq, key.empty() ? a->gen.input() : std::span<const int32_t>(key));
    if (!a->counted) {  // first admission, not a preempted stream's return
      a->counted = true;
      const auto n_prompt = static_cast<int64_t>(a->gen.context_size());
      a->cached_tokens = std::min(adopted, n_prompt);
      counts_.prompt_tokens += n_prompt;
    }
    // An embedding input's sum is (re)computed whole: a preempted one starts again.
    if (a->embeds()) a->pooled.assign(static_cast<size_t>(model_.config().hidden_size), 0.0f);
    a->prompt_hidden.clear();
    a->admitted = true;
    running_.push_back(std::move(a));
  }
}

void Scheduler::refuse_unfittable_head() {
  ActivePtr head;
  {
    std::lock_guard lock(mu_);
    if (!queue_.empty()) {
      head = std::move(queue_.front());
      queue_.pop_front();
    }
  }
  if (head) {
    retire(*head, FinishReason::kError,
           "the request does not fit the KV cache even when it runs alone");
  }
}

bool Scheduler::build_step() {
  items_.clear();
  step_rows_.clear();
  decoding_.clear();
  // Decode rows first, so prefill never starves the streams already decoding: each decoding
  // stream (one token fed short of its input) adds its last token and the drafts the
  // Speculator plans for it, wanting logits for all of them.
  std::vector<Active*> decoders;
  for (auto& owned : running_) {
    Active& a = *owned;
    if (a.embeds() || a.input_size() - static_cast<int64_t>(a.seq.tokens.size()) != 1) continue;
    if (static_cast<int64_t>(decoders.size()) >= model_.max_rows()) break;
    decoders.push_back(&a);
    decoding_.push_back(&a.ds);
  }
  int64_t rows = 0;
  if (!decoding_.empty()) {
    spec_.plan(decoding_, model_.max_rows() - static_cast<int64_t>(decoding_.size()));
    // The verify order (speculative/draft_tree.h): below the canonical width the streams with
    // the most draft rows first; no stream's result depends on it.
    std::vector<speculative::VerifyKey> keys;
    for (size_t i = 0; i < decoders.size(); ++i) {
      keys.push_back({.slot = static_cast<int64_t>(i),
                      .depth = static_cast<int64_t>(decoders[i]->ds.ids.size()) - 1});
    }
    std::vector<Active*> in_order;
    for (const int64_t i : speculative::verify_order(keys))
      in_order.push_back(decoders[static_cast<size_t>(i)]);
    for (Active* a : in_order) {
      const auto len = static_cast<int64_t>(a->ds.ids.size());
      items_.push_back(
          {.seq = &a->seq, .ids = a->ds.ids, .logits = LogitRows::kAll, .tree = a->ds.parents});
      step_rows_.push_back({.owner = a, .decoding = true, .wanted = len});
      rows += len;
    }
  }
  int64_t prefill_budget = options_.prefill_chunk;
  for (auto& owned : running_) {
    Active& a = *owned;
    const auto have = static_cast<int64_t>(a.seq.tokens.size());
    const int64_t left = a.input_size() - have;
    // (An embedding input's last token is a prefill row too: it never decodes.)
    if (left < 1 || (left == 1 && !a.embeds())) continue;
    int64_t len = std::min({left, prefill_budget, model_.max_rows() - rows});
    if (requires_single_chunk_prefill(model_.config()) && len < left) len = 0;
    if (len <= 0) continue;
    // Hybrid models: end the chunk where the prefix cache will snapshot the state.
    for (const int64_t p : a.snapshot_points) {
      if (p > have && p < have + len) {
        len = p - have;
        break;
      }
    }
    prefill_budget -= len;
    // A chunk that reaches the end of the input wants logits: its last row. An embedding
    // input's chunks want none; their rows are pooled instead. A hidden-reading drafter's
    // stream wants every row: the step records the final-norm rows of those (HiddenSink).
    const bool last = have + len == a.input_size() && !a.embeds();
    const bool every_row = a.reads_hidden && drafter_prefill();
    items_.push_back(
        {.seq = &a.seq,
         .ids = a.gen.input().subspan(static_cast<size_t>(have), static_cast<size_t>(len)),
         .logits = every_row ? LogitRows::kAll
                   : last    ? LogitRows::kLast
                             : LogitRows::kNone,
         .pool = a.embeds() ? pooled_rows(options_.embedding->pooling, have, len, a.input_size())
                            : PoolRows::kNone});
    if (a.mm != nullptr) {
      // The prompt's rows take their (t, h, w) positions and the tower's output; generated
      // tokens recomputed after a preemption rotate at p + rope_delta on every axis.
      StepItem& item = items_.back();
      const auto n_prompt = static_cast<int64_t>(a.mm->ids.size());
      a.chunk_pos3.clear();
      for (int64_t r = have; r < have + len; ++r) {
        for (int axis = 0; axis < 3; ++axis) {
          a.chunk_pos3.push_back(r < n_prompt ? a.mm->positions3[static_cast<size_t>(r * 3 + axis)]
                                              : static_cast<int32_t>(r + a.mm->rope_delta));
        }
      }
      item.positions3 = a.chunk_pos3;
      const std::vector<int32_t>& er = a.mm->embed_rows;
      const auto first = std::lower_bound(er.begin(), er.end(), static_cast<int32_t>(have));
      const auto end = std::lower_bound(first, er.end(), static_cast<int32_t>(have + len));
      a.chunk_rows.clear();
      for (auto e = first; e != end; ++e) a.chunk_rows.push_back(*e - static_cast<int32_t>(have));
      if (!a.chunk_rows.empty()) {
        const int64_t H = model_.injected_cols();  // hidden_size, and any deepstack features
        item.embeds = ConstRows{a.mm->embeds.data() + (first - er.begin()) * H,
                                static_cast<int64_t>(a.chunk_rows.size()), H, H};
        item.embed_rows = a.chunk_rows;
      }
    }
    step_rows_.push_back({.owner = &a,
                          .decoding = false,
                          .wanted = every_row ? len
                                    : last    ? 1
                                              : 0,
                          .picks = last});
    rows += len;
  }
  return !items_.empty();
}

bool Scheduler::drop_drafts() {
  bool dropped = false;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (!step_rows_[i].decoding || items_[i].ids.size() <= 1) continue;
    Active& a = *step_rows_[i].owner;
    a.ds.ids.resize(1);
    items_[i].ids = a.ds.ids;
    step_rows_[i].wanted = 1;
    dropped = true;
  }
  return dropped;
}

bool Scheduler::reserve_pages() {
  const int64_t page = model_.kv_pool().layout().page_size;
  for (;;) {
    int64_t need = 0;
    for (const StepItem& it : items_) {
      const auto total = static_cast<int64_t>(it.seq->tokens.size() + it.ids.size());
      need += std::max<int64_t>(
          0, (total + page - 1) / page - static_cast<int64_t>(it.seq->block_table.size()));
    }
    if (model_.kv_pool().free_pages() >= need || cache_->make_room(need) >= need) return true;
    // Drafts go before anything is preempted: plain decode rows need fewer pages.
    if (!drop_drafts()) break;
  }
  // Preempt the youngest stream and build the step again without it. Alone and still out of
  // pages, the oldest stream has used the whole KV budget: its context is full.
  if (!preempt_youngest(running_.front().get())) {
    retire(*running_.front(), FinishReason::kLength);
    running_.clear();
  }
  return false;
}

bool Scheduler::run_step() {
  int64_t n_want = 0;
  for (const StepRows& r : step_rows_) n_want += r.wanted;
  logits_.resize(static_cast<size_t>(n_want * model_.vocab_size()));
  // Each pooling item's row starts from its sum so far (a mean over several chunks).
  pooled_.clear();
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].pool == PoolRows::kNone) continue;
    const std::vector<float>& sum = step_rows_[i].owner->pooled;
    pooled_.insert(pooled_.end(), sum.begin(), sum.end());
  }
  // The final-norm rows of the wanted rows, when a stream of the step has a hidden-reading
  // drafter (hidden_ then holds one row per logits row, in the same order).
  hidden_.clear();
  const bool record = std::any_of(step_rows_.begin(), step_rows_.end(),
                                  [](const StepRows& r) { return r.owner->reads_hidden; });
  const HiddenSink sink = spec_.sink_into(hidden_, 0);
  try {
    model_.step(items_, logits_, record ? &sink : nullptr, pooled_);
  } catch (const Error& e) {
    // The step changed no sequence. Out of pages (a shared page copied on write): make room
    // by preempting; anything else fails the step's requests.
    if (running_.size() > 1 && preempt_youngest(running_.front().get())) return false;
    for (const StepRows& r : step_rows_) retire(*r.owner, FinishReason::kError, e.message());
    std::erase_if(running_, [](const auto& a) { return !a->admitted; });
    return false;
  }
  ++counts_.steps;
  return true;
}

ConstRows Scheduler::hidden_rows(size_t first, size_t n) const {
  const auto H = static_cast<size_t>(model_.config().hidden_size);
  METRALE_CHECK((first + n) * H <= hidden_.size(), "scheduler: the step recorded ",
                hidden_.size() / H, " hidden rows; rows ", first, "..", first + n, " wanted");
  return {hidden_.data() + first * H, static_cast<int64_t>(n), static_cast<int64_t>(H),
          static_cast<int64_t>(H)};
}

void Scheduler::post_process() {
  const auto V = static_cast<size_t>(model_.vocab_size());
  const auto H = static_cast<size_t>(model_.config().hidden_size);
  size_t w = 0;  // the step's logits row
  size_t k = 0;  // pooling items seen
  for (size_t i = 0; i < items_.size(); ++i) {
    Active& a = *step_rows_[i].owner;
    const auto len = static_cast<int64_t>(items_[i].ids.size());
    const auto wanted = static_cast<size_t>(step_rows_[i].wanted);
    const int64_t before = a.gen.completion_tokens();
    if (a.embeds()) {
      counts_.prefill_tokens += len;
      if (items_[i].pool != PoolRows::kNone) {
        const auto row = pooled_.begin() + static_cast<ptrdiff_t>(k++ * H);
        std::copy(row, row + static_cast<ptrdiff_t>(H), a.pooled.begin());
      }
      if (static_cast<int64_t>(a.seq.tokens.size()) < a.input_size()) {
        cache_insert(a);
        continue;
      }
      const Pooling p = options_.embedding->pooling;
      const bool means = p == Pooling::kMean || p == Pooling::kMeanSqrtLen;
      a.embedding = finish_embedding(*options_.embedding, a.pooled, means ? a.input_size() : 1,
                                     a.embed->dimensions);
      retire(a, FinishReason::kStop);
      continue;
    }
    if (step_rows_[i].decoding) {
      // The stream's rows (its last token, its drafts) are verified, accepted and rolled back
      // in one place, the same as Session's.
      const SpeculationCounts was = a.ds.counts;
      const ConstRows hidden = a.reads_hidden ? hidden_rows(w, wanted) : ConstRows{};
      spec_.finish(a.ds, std::span(logits_).subspan(w * V, wanted * V), hidden);
      counts_.speculation.verify_steps += a.ds.counts.verify_steps - was.verify_steps;
      counts_.speculation.drafted += a.ds.counts.drafted - was.drafted;
      counts_.speculation.accepted += a.ds.counts.accepted - was.accepted;
    } else {
      counts_.prefill_tokens += len;
      const bool picks = step_rows_[i].picks;
      // Share the prompt's whole pages while it is still running.
      if (!picks || len > 1) cache_insert(a);
      if (a.reads_hidden) {
        const ConstRows h = hidden_rows(w, wanted);
        a.prompt_hidden.insert(a.prompt_hidden.end(), h.data,
                               h.data + static_cast<size_t>(h.n_rows) * H);
      }
      if (!picks) {
        w += wanted;
        continue;
      }
      a.gen.accept(
          a.gen.pick(std::span(logits_).subspan((w + wanted - 1) * V, V), spec_.scratch()));
    }
    w += wanted;
    counts_.generated_tokens += a.gen.completion_tokens() - before;
    if (a.gen.ended()) {
      retire(a, finish_of(*a.gen.end()));
      continue;
    }
    // The prompt is in the cache and the first token picked: the drafter starts (a
    // hidden-reading one prefilled from the prompt's rows, which are then dropped).
    if (a.speculative && a.ds.drafter == nullptr) {
      if (!a.reads_hidden) {
        spec_.start(a.ds);
      } else {
        const auto P = static_cast<int64_t>(a.seq.tokens.size());
        const int64_t rows = P - a.hidden_from;
        const ConstRows h = rows_of(a.prompt_hidden.data(), rows, static_cast<int64_t>(H));
        if (!drafter_prefill()) {
          // The prompt's last row only (the last chunk's one wanted row).
          if (a.prompt_hidden.size() >= H)
            spec_.start(a.ds, rows_of(a.prompt_hidden.data() + a.prompt_hidden.size() - H, 1,
                                      static_cast<int64_t>(H)));
        } else if (a.prompt_hidden.size() != static_cast<size_t>(rows) * H) {
          // (Not expected: the drafter needs every row; the stream decodes without drafts.)
        } else if (a.carried != nullptr && a.carry_first_key >= a.hidden_from) {
          const int64_t skip = a.carry_first_key - a.hidden_from;
          spec_.adopt(a.ds, std::move(a.carried), a.carry_first_key,
                      {h.row(skip), rows - skip, h.n_cols, h.stride});
          counts_.carry_rows_adopted += a.carry_first_key;
          counts_.drafter_prefill_rows += P - 1 - a.carry_first_key;
        } else if (a.hidden_from == 0) {
          spec_.start(a.ds, h);
          counts_.drafter_prefill_rows += P - 1;
        }
        spec_.free(std::move(a.carried));
        std::vector<float>().swap(a.prompt_hidden);
      }
    }
    report(a, std::nullopt);
  }
  std::erase_if(running_, [](const auto& a) { return !a->admitted; });
}

void Scheduler::report(Active& a, std::optional<FinishReason> finish, std::string error) {
  // While it runs, only what no later token can change; at a normal end everything held back
  // for stop strings; a cancelled or failed stream sends its tokens and no more text.
  const bool abandoned = finish == FinishReason::kError || finish == FinishReason::kCancelled;
  GenerationDelta d = a.gen.take(!finish.has_value() ? Release::kCertain
                                 : abandoned         ? Release::kNone
                                                     : Release::kAll);
  ServeEvent e;
  e.text = std::move(d.text);
  e.tokens = std::move(d.tokens);
  e.logprobs = std::move(d.logprobs);
  if (!a.got_first && !e.tokens.empty()) {
    a.got_first = true;
    e.time_to_first_token = seconds_between(a.submitted, Clock::now());
  }
  if (finish.has_value()) {
    e.done = true;
    e.finish = *finish;
    e.error = std::move(error);
    e.embedding = std::move(a.embedding);
    e.usage = {.prompt_tokens = static_cast<int64_t>(a.gen.context_size()),
               .completion_tokens = a.gen.completion_tokens(),
               .cached_tokens = a.cached_tokens,
               .speculative = a.speculative,
               .draft_tokens = a.ds.counts.drafted,
               .accepted_draft_tokens = a.ds.counts.accepted};
  } else if (e.tokens.empty()) {
    return;
  }
  a.stream->push(std::move(e));
}

void Scheduler::retire(Active& a, FinishReason why, std::string error) {
  if (a.done) return;
  a.done = true;
  if (why != FinishReason::kError) keep_carry(a);
  spec_.stop(a.ds);
  spec_.free(std::move(a.carried));
  if (a.speculative && a.ds.counts.drafted > 0) {
    const double rate =
        static_cast<double>(a.ds.counts.accepted) / static_cast<double>(a.ds.counts.drafted);
    for (size_t b = 0; b < std::size(SchedulerStats::kAcceptanceBuckets); ++b) {
      if (rate <= SchedulerStats::kAcceptanceBuckets[b]) ++counts_.acceptance_le[b];
    }
    ++counts_.acceptance_count;
    counts_.acceptance_sum += rate;
  }
  if (a.admitted) {
    if (why != FinishReason::kError) cache_insert(a);
    model_.release(a.seq);
    a.admitted = false;
  }
  switch (why) {
    case FinishReason::kStop:
    case FinishReason::kLength:
      ++counts_.finished;
      break;
    case FinishReason::kCancelled:
      ++counts_.cancelled;
      break;
    case FinishReason::kTimeout:
      ++counts_.timed_out;
      break;
    case FinishReason::kError:
      ++counts_.failed;
      break;
  }
  // The figures count this request before its client hears the end: a client that reads
  // stats() (or /metrics) right after its reply sees it.
  {
    std::lock_guard lock(mu_);
    publish();
  }
  report(a, why, std::move(error));
}

bool Scheduler::preempt_youngest(const Active* keep) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (it->get() == keep) continue;
    Active& a = **it;
    cache_insert(a);
    spec_.stop(a.ds);  // begun again once it is prefilled anew
    spec_.free(std::move(a.carried));
    std::vector<float>().swap(a.prompt_hidden);
    model_.release(a.seq);
    a.admitted = false;
    a.preempted_at_step = counts_.steps;
    ++counts_.preemptions;
    ActivePtr back = std::move(*it);
    running_.erase(std::next(it).base());
    std::lock_guard lock(mu_);
    queue_.push_front(std::move(back));
    return true;
  }
  return false;
}

}  // namespace metrale
