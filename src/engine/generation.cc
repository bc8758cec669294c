#include "engine/generation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace metrale {
namespace {

// How many already-committed tokens the detokenizer decodes again with the new ones, so a
// token whose text depends on its neighbours (a leading space a decoder strips at the start,
// a character split over tokens) comes out as the whole sequence's decode.
constexpr size_t kDetokenizeContext = 6;
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Where `text` may be cut at or below `upto` without splitting a UTF-8 character.
size_t utf8_floor(const std::string& text, size_t upto) {
  while (upto > 0 && upto < text.size() && (static_cast<unsigned char>(text[upto]) & 0xC0) == 0x80)
    --upto;
  return upto;
}

// The log-softmax of the raw logits `row` for `token` and its `top` most likely alternatives.
TokenLogprob logprob_of(std::span<const float> row, int32_t token, int top) {
  TokenLogprob lp;
  lp.id = token;
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : row) mx = std::max(mx, x);
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x - mx));
  const auto lse = static_cast<float>(static_cast<double>(mx) + std::log(sum));
  lp.logprob = row[static_cast<size_t>(token)] - lse;
  if (top > 0) {
    std::vector<std::pair<float, int32_t>> best;  // a min-heap of the `top` largest
    best.reserve(static_cast<size_t>(top) + 1);
    auto cmp = [](const auto& x, const auto& y) {
      return x.first > y.first || (x.first == y.first && x.second < y.second);
    };
    for (size_t i = 0; i < row.size(); ++i) {
      if (static_cast<int>(best.size()) < top) {
        best.emplace_back(row[i], static_cast<int32_t>(i));
        std::push_heap(best.begin(), best.end(), cmp);
      } else if (row[i] > best.front().first) {
        std::pop_heap(best.begin(), best.end(), cmp);
        best.back() = {row[i], static_cast<int32_t>(i)};
        std::push_heap(best.begin(), best.end(), cmp);
      }
    }
    std::sort_heap(best.begin(), best.end(), cmp);
    for (const auto& [x, id] : best) lp.top.emplace_back(id, x - lse);
  }
  return lp;
}

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kEos:
      return "eos";
    case StopReason::kStopString:
      return "stop string";
    case StopReason::kMaxTokens:
      return "max tokens";
    case StopReason::kContextFull:
      return "context full";
  }
  return "?";
}

Generation::Generation(GenerationParams params, std::vector<int32_t> context,
                       const Tokenizer* tokenizer)
    : p_(std::move(params)),
      tok_(tokenizer),
      input_(std::move(context)),
      n_context_(input_.size()),
      rng_(p_.seed) {
  METRALE_CHECK(p_.max_tokens >= 0, "generation: max_tokens must be >= 0, found ", p_.max_tokens);
  METRALE_CHECK(p_.top_logprobs >= -1, "generation: top_logprobs must be >= -1, found ",
                p_.top_logprobs);
  for (const std::string& s : p_.stop) hold_ = std::max(hold_, s.empty() ? 0 : s.size() - 1);
  if (p_.max_tokens == 0) end_ = StopReason::kMaxTokens;
  if (p_.grammar) {
    matcher_.emplace(p_.grammar);
    // The first token's mask fills while the prompt is prefilled.
    if (!ended()) matcher_->prefetch();
  }
}

int32_t Generation::pick(std::span<float> row, PickScratch& scratch) {
  if (p_.top_logprobs >= 0) scratch.raw.assign(row.begin(), row.end());
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    // Each distinct generated id once, with how often it was generated.
    std::vector<int32_t>& ids = scratch.ids;
    const std::span<const int32_t> gen = generated();
    ids.assign(gen.begin(), gen.end());
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      row[static_cast<size_t>(ids[i])] -=
          p_.presence_penalty + p_.frequency_penalty * static_cast<float>(j - i);
      i = j;
    }
  }
  // logit_bias after the penalties, before the processors and the greedy pick; logprobs come
  // from the row as given, so the bias does not change them.
  for (const auto& [id, bias] : p_.logit_bias) {
    METRALE_CHECK(id >= 0 && static_cast<size_t>(id) < row.size(), "logit_bias: token id ", id,
                  " is outside the vocabulary [0, ", row.size(), ")");
    row[static_cast<size_t>(id)] += bias;
  }
  // The grammar's mask last: neither a penalty nor a bias brings back a disallowed token.
  if (matcher_) matcher_->apply_mask(row);
  const SamplingParams& s = p_.sampling;
  // HF's repetition penalty counts the context too (its input_ids).
  const std::span<const int32_t> seen =
      s.repetition_penalty != 1.0f ? std::span<const int32_t>(input_) : std::span<const int32_t>();
  int32_t token = 0;
  if (s.temperature <= 0.0f) {
    if (s.repetition_penalty != 1.0f) {
      scratch.sampler.process(
          row, {.temperature = 1.0f, .repetition_penalty = s.repetition_penalty}, seen);
    }
    token = argmax(row);
  } else {
    token = scratch.sampler.sample(row, s, seen, rng_);
  }
  if (p_.top_logprobs >= 0) picked_.push_back(logprob_of(scratch.raw, token, p_.top_logprobs));
  return token;
}

size_t Generation::accept(std::span<const int32_t> tokens) {
  size_t taken = 0;
  for (; taken < tokens.size() && !ended(); ++taken) {
    if (p_.top_logprobs >= 0) {
      METRALE_CHECK(taken < picked_.size() && picked_[taken].id == tokens[taken],
                    "generation: token ", taken, " (", tokens[taken],
                    ") was not picked from logits, but logprobs are wanted");
    }
    accept_one(tokens[taken], p_.top_logprobs >= 0 ? &picked_[taken] : nullptr);
  }
  picked_.clear();
  // The next token's mask depends only on the tokens accepted: it fills beside the next
  // forward (and the other rows' picks) on the mask workers, and the pick waits for it.
  if (matcher_ && taken > 0 && !ended()) matcher_->prefetch();
  return taken;
}

void Generation::accept_one(int32_t token, TokenLogprob* logprob) {
  undo_.push_back({.text_size = text_.size(),
                   .text_ids = text_ids_.size(),
                   .prefix = prefix_,
                   .read = read_,
                   .emitted = emitted_,
                   .tokens = pending_tokens_.size(),
                   .logprobs = pending_logprobs_.size(),
                   .joined = false,
                   .matched = false,
                   .text = std::nullopt});
  ++completion_;
  if (matcher_) {
    METRALE_CHECK(matcher_->accept(token), "generation: token ", token,
                  " is not allowed by the request's grammar here");
    undo_.back().matched = true;
    // The grammar took an eos at its accept state: nothing can follow, ignore_eos or not.
    if (matcher_->terminated()) {
      end_ = StopReason::kEos;
      return;
    }
  }
  // An eos ends generation without joining the output, nor the logprobs.
  if (!p_.ignore_eos &&
      std::find(p_.eos_ids.begin(), p_.eos_ids.end(), token) != p_.eos_ids.end()) {
    end_ = StopReason::kEos;
    return;
  }
  input_.push_back(token);
  pending_tokens_.push_back(token);
  undo_.back().joined = true;
  if (logprob != nullptr) pending_logprobs_.push_back(std::move(*logprob));
  // An id the tokenizer lacks (a padding row of a larger embedding, which random or
  // undertrained weights may pick) prints nothing, as the tokenizers library skips it.
  if (tok_ != nullptr && tok_->id_to_token(token).has_value()) {
    text_ids_.push_back(token);
    detokenize();
    check_stop_strings();
  }
  if (ended()) return;
  if (completion_ >= p_.max_tokens) {
    end_ = StopReason::kMaxTokens;
  } else if (static_cast<int64_t>(input_.size()) >= p_.max_input) {
    end_ = StopReason::kContextFull;
  }
}

void Generation::detokenize() {
  // Decode the new tokens with a few committed ones before them; the new text is what the
  // longer decode adds to the shorter one (vLLM's incremental detokenizer). A window that
  // ends inside a character (U+FFFD) waits for the next token.
  const std::span<const int32_t> all(text_ids_);
  const std::string before =
      tok_->decode(all.subspan(prefix_, read_ - prefix_), p_.skip_special_tokens);
  const std::string after = tok_->decode(all.subspan(prefix_), p_.skip_special_tokens);
  if (after.ends_with(kReplacementChar)) return;
  if (after.size() > before.size() && after.starts_with(before)) {
    text_ += after.substr(before.size());
  } else if (!after.starts_with(before)) {
    // The window decodes differently from its start: decode everything once.
    if (!undo_.back().text.has_value()) undo_.back().text = text_;
    text_ = tok_->decode(all, p_.skip_special_tokens);
    emitted_ = std::min(emitted_, text_.size());
  } else {
    return;  // no text yet (a token the decode skips)
  }
  read_ = text_ids_.size();
  prefix_ = read_ > kDetokenizeContext ? read_ - kDetokenizeContext : 0;
}

void Generation::check_stop_strings() {
  for (const std::string& stop : p_.stop) {
    if (stop.empty()) continue;
    // What was released holds no stop string: search from where one could still start.
    const size_t from = emitted_ > stop.size() ? emitted_ - stop.size() : 0;
    const size_t at = text_.find(stop, from);
    if (at == std::string::npos) continue;
    if (!undo_.back().text.has_value()) undo_.back().text = text_;
    text_.resize(at);
    emitted_ = std::min(emitted_, at);
    end_ = StopReason::kStopString;
    return;
  }
}

void Generation::rollback(size_t n) {
  METRALE_CHECK(n <= undo_.size(), "generation: cannot roll back ", n, " tokens; ", undo_.size(),
                " were accepted since the last report");
  // Only the last accepted token can have ended generation, and it goes first.
  if (n > 0) end_.reset();
  size_t matched = 0;
  for (; n > 0; --n) {
    Undo& u = undo_.back();
    matched += u.matched ? 1 : 0;
    if (u.joined) input_.pop_back();
    // A token only appends to the text, unless it rewrote or cut it (then the text before
    // the rewrite, or before the cut, was kept: the text before the token is its start).
    if (u.text.has_value()) text_ = std::move(*u.text);
    text_.resize(u.text_size);
    text_ids_.resize(u.text_ids);
    prefix_ = u.prefix;
    read_ = u.read;
    emitted_ = u.emitted;
    pending_tokens_.resize(u.tokens);
    pending_logprobs_.resize(u.logprobs);
    --completion_;
    undo_.pop_back();
  }
  if (matcher_) {
    matcher_->rollback(matched);
    if (!ended()) matcher_->prefetch();
  }
}

GenerationDelta Generation::take(Release what) {
  GenerationDelta d;
  if (what == Release::kAll) {
    if (p_.end_shows_partial_char && tok_ != nullptr && read_ < text_ids_.size() &&
        end_ != StopReason::kStopString) {
      // The tokens after the last whole character, as the tokenizer's decode shows them.
      const std::span<const int32_t> all(text_ids_);
      const std::string before =
          tok_->decode(all.subspan(prefix_, read_ - prefix_), p_.skip_special_tokens);
      const std::string after = tok_->decode(all.subspan(prefix_), p_.skip_special_tokens);
      if (after.starts_with(before)) {
        text_ += after.substr(before.size());
      } else {
        text_ = tok_->decode(all, p_.skip_special_tokens);
        emitted_ = std::min(emitted_, text_.size());
      }
      read_ = text_ids_.size();
      prefix_ = read_ > kDetokenizeContext ? read_ - kDetokenizeContext : 0;
    }
    if (text_.size() > emitted_) d.text = text_.substr(emitted_);
    emitted_ = text_.size();
  } else if (what == Release::kCertain) {
    const size_t upto = utf8_floor(text_, text_.size() > hold_ ? text_.size() - hold_ : 0);
    if (upto > emitted_) {
      d.text = text_.substr(emitted_, upto - emitted_);
      emitted_ = upto;
    }
  }
  d.tokens = std::move(pending_tokens_);
  d.logprobs = std::move(pending_logprobs_);
  pending_tokens_.clear();
  pending_logprobs_.clear();
  undo_.clear();
  return d;
}

}  // namespace metrale
