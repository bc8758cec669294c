// What a stream takes from and leaves to the scheduler's caches (scheduler.h): the MTP carry
// (drafter rows kept per session), the prefix cache's keys and inserts, and the vision tower's
// output for a media request.
#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <utility>

#include "engine/session.h"
#include "serve/scheduler.h"
#include "serve/scheduler_active.h"

namespace metrale {

int64_t Scheduler::plan_carry(Active& a, bool count) {
  spec_.free(std::move(a.carried));
  if (options_.carry_tokens <= 0) return -1;
  // The session's own record; without one, the record sharing the longest prefix (at least 2
  // tokens) with the prompt — another session's conversation, which this one may not use
  // (kForeignSession); without either, nothing (kNoCarry). Prompts with media compare their
  // cache keys (image rows by content hash), so rows drafted over one image never serve another.
  const std::vector<int32_t> media_key = cache_key(a);
  const std::span<const int32_t> input =
      media_key.empty() ? a.gen.input() : std::span<const int32_t>(media_key);
  auto own = std::find_if(carried_.begin(), carried_.end(), [&](const Carried& c) {
    return a.session != 0 && c.record.session == a.session;
  });
  const Carried* record = own != carried_.end() ? &*own : nullptr;
  if (record == nullptr) {
    size_t best = 1;
    for (const Carried& c : carried_) {
      const size_t n = std::min(c.record.tokens.size(), input.size());
      const auto common = static_cast<size_t>(
          std::mismatch(c.record.tokens.begin(), c.record.tokens.begin() + n, input.begin()).first -
          c.record.tokens.begin());
      if (common > best) {
        best = common;
        record = &c;
      }
    }
  }
  const speculative::CarryDecision d = speculative::usable_by(
      record == nullptr ? nullptr : &record->record,
      {.session = a.session, .hidden_source = a.hidden_source, .prompt = input});
  if (count) ++counts_.carry_outcomes[static_cast<size_t>(d.outcome)];
  if (own == carried_.end()) return -1;
  // The session's record is used up either way: adopted, or stale for this session.
  carry_rows_held_ -= own->record.last_key + 1;
  std::unique_ptr<speculative::ProposerState> state = std::move(own->state);
  carried_.erase(own);
  if (d.outcome != speculative::CarryOutcome::kAdopted) {
    spec_.free(std::move(state));
    return -1;
  }
  a.carried = std::move(state);
  a.carry_first_key = d.adopt_through + 1;
  return d.adopt_through;
}

void Scheduler::keep_carry(Active& a) {
  if (options_.carry_tokens <= 0 || !a.reads_hidden || a.session == 0 || !a.admitted) return;
  int64_t last_key = -1;
  std::unique_ptr<speculative::ProposerState> state = spec_.take(a.ds, last_key);
  if (state == nullptr) last_key = -1;
  const std::vector<int32_t> media_key = cache_key(a);
  const std::span<const int32_t> context =
      media_key.empty() ? a.gen.input() : std::span<const int32_t>(media_key);
  last_key = std::min<int64_t>(last_key, static_cast<int64_t>(context.size()) - 2);
  if (last_key < 0) {
    spec_.free(std::move(state));
    last_key = -1;
  }
  // One record per session: its latest request's.
  for (auto it = carried_.begin(); it != carried_.end(); ++it) {
    if (it->record.session != a.session) continue;
    carry_rows_held_ -= it->record.last_key + 1;
    spec_.free(std::move(it->state));
    carried_.erase(it);
    break;
  }
  carried_.push_back({.record = {.session = a.session,
                                 .hidden_source = a.hidden_source,
                                 .tokens = std::vector<int32_t>(context.begin(), context.end()),
                                 .last_key = last_key},
                      .state = std::move(state)});
  carry_rows_held_ += last_key + 1;
  // Past the budget, the least recently finished sessions' rows go first.
  const int64_t page = model_.kv_pool().layout().page_size;
  auto pages = [page](int64_t rows) { return (rows + page - 1) / page; };
  for (;;) {
    int64_t held = 0;
    for (const Carried& c : carried_) held += pages(c.record.last_key + 1) * page;
    if (held <= options_.carry_tokens || carried_.empty()) break;
    carry_rows_held_ -= carried_.front().record.last_key + 1;
    spec_.free(std::move(carried_.front().state));
    carried_.erase(carried_.begin());
  }
}

std::vector<int32_t> Scheduler::cache_key(const Active& a) const {
  if (a.key.empty()) return {};
  std::vector<int32_t> key = a.key;
  const std::span<const int32_t> input = a.gen.input();
  key.insert(key.end(), input.begin() + static_cast<ptrdiff_t>(a.key.size()), input.end());
  return key;
}

void Scheduler::cache_insert(const Active& a) {
  if (a.key.empty()) {
    cache_->insert(a.seq);
    return;
  }
  cache_->insert(a.seq, cache_key(a));
}

bool Scheduler::encode_media(Active& a, int64_t from) {
  a.seq.rope_delta = a.mm->rope_delta;
  // Items wholly inside the adopted prefix need no tower output (a multi-turn chat's earlier
  // images, even when the tower cache no longer holds them); a preempted stream keeps what it
  // has and encodes only what its recompute now needs.
  try {
    if (!a.counted) counts_.media_items += static_cast<int64_t>(a.media.size());
    counts_.media_encoded += encode_multimodal_prompt(
        model_, *a.mm, a.media, options_.vision_cache_bytes > 0 ? &vision_cache_ : nullptr,
        a.hashes, from);
  } catch (const Error& e) {
    model_.release(a.seq);
    retire(a, FinishReason::kError, e.message());
    return false;
  }
  return true;
}

}  // namespace metrale
