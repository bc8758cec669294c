#pragma once
// One stream's generation control: everything between "the model gave logits" and "this text
// goes to the user", in one place for Session, generate_batch and the server's Scheduler.
//
// A Generation owns its stream's input (the context it continues, then every token it
// accepted), the pick (penalties, logit_bias, the sampling processors or the greedy argmax,
// over a seeded Rng), the end conditions (eos, stop strings, max_tokens, a full context), the
// incremental detokenizer, the hold-back window and the logprobs bookkeeping. It knows no
// Model: callers run the steps and hand it logits and tokens.
//
// Tokens arrive in groups: accept(k tokens) takes them in order until one ends generation, so
// a step that yields several tokens of one stream (a speculative verify) goes through the same
// code as one decode row; rollback(n) undoes the last n accepted tokens while nothing of them
// was reported yet.
//
// Text: the detokenizer decodes only a small window (the new tokens plus a few reported ones
// before them, vLLM's incremental detokenizer), so a token costs the same at any length; a
// character whose bytes span tokens is committed once whole. take(Release::kCertain) reports
// what no later token can change: whole UTF-8 characters, and not the last (longest stop
// string - 1) bytes, which a stop string completed by a later token would cut away.
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/sampling.h"
#include "grammar/grammar.h"
#include "io/tokenizer/tokenizer.h"

namespace metrale {

// Why generation ended. The server reports kEos and kStopString as "stop", kMaxTokens and
// kContextFull as "length".
enum class StopReason : uint8_t { kEos, kStopString, kMaxTokens, kContextFull };
std::string_view stop_reason_name(StopReason r);  // "eos", "stop string", ...

struct TokenLogprob {
  int32_t id = 0;
  // log-softmax of the model's logits (before the penalties, logit_bias and sampling's
  // processors: a bias does not change reported logprobs, as vLLM's default)
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most likely, best first
};

struct GenerationParams {
  SamplingParams sampling{.temperature = 0.0f};  // greedy unless temperature > 0
  // OpenAI's penalties over the generated tokens (not the context): each generated token's
  // logit drops by presence_penalty once and by frequency_penalty per time it was generated,
  // before the sampling processors (and before a greedy pick), as vLLM.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // (token id, bias) added to the logits after the penalties, before the processors.
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
  std::vector<int32_t> eos_ids;  // the ids that end generation (resolved: default_eos_ids)
  bool ignore_eos = false;
  std::vector<std::string> stop;  // stop strings: the text is cut before the first found
  bool skip_special_tokens = true;
  int top_logprobs = -1;  // -1: no logprobs; k >= 0: the token's and k alternatives
  // Accepted tokens (the one that ends generation included) after which it ends; 0: none.
  int64_t max_tokens = 16;
  // Generation ends (kContextFull) once the input (context + generated) holds this many.
  int64_t max_input = std::numeric_limits<int64_t>::max();
  // At the end, the text of tokens that stopped inside a UTF-8 character: U+FFFD (the
  // tokenizer's decode of the tokens, which Session's text is) or nothing (the server, as
  // vLLM's detokenizer).
  bool end_shows_partial_char = false;
  // Structured outputs: the grammar the output must match (null: unconstrained). pick()
  // masks the tokens it disallows after the penalties and logit_bias, before the sampling
  // processors and the greedy pick; accept() advances its matcher, rollback() undoes it.
  // Each then queues the next mask's fill on the grammar's mask workers (GrammarMatcher::
  // prefetch), so it runs beside the next forward; the pick waits for it.
  std::shared_ptr<const CompiledGrammar> grammar;
};

// What take() hands over: the tokens accepted since the last take (an eos is not one), their
// logprobs when top_logprobs >= 0, and the text released.
struct GenerationDelta {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
};

enum class Release : uint8_t {
  kCertain,  // while generating: the text no later token can change
  kAll,      // at the end: everything, held-back text too
  kNone,     // tokens only (a stream cancelled or failed keeps its held-back text)
};

// Scratch the picks of many generations share, one per thread: the sampler's buffers and a
// copy of the row for logprobs, sized for the vocabulary once (so a queued request holds none).
struct PickScratch {
  explicit PickScratch(int64_t vocab_size) : sampler(vocab_size) {}
  Sampler sampler;
  std::vector<float> raw;    // the row before pick() rewrote it
  std::vector<int32_t> ids;  // the penalties': the generated ids, sorted
};

class Generation {
 public:
  // `context`: the tokens before the generated ones (the prompt; for a Session, its earlier
  // turns too): the repetition penalty sees them, and max_input counts them. `tokenizer`
  // may be null (no text, no stop strings).
  Generation(GenerationParams params, std::vector<int32_t> context, const Tokenizer* tokenizer);

  const GenerationParams& params() const { return p_; }
  // The model's input: the context, then every accepted token (an eos is not one).
  std::span<const int32_t> input() const { return input_; }
  size_t context_size() const { return n_context_; }
  std::span<const int32_t> generated() const {
    return std::span<const int32_t>(input_).subspan(n_context_);
  }
  // Accepted tokens, the one that ended generation (an eos) included: the usage's count.
  int64_t completion_tokens() const { return completion_; }
  std::optional<StopReason> end() const { return end_; }
  bool ended() const { return end_.has_value(); }
  // The text so far (committed characters; cut before a stop string).
  const std::string& text() const { return text_; }

  // Picks the next token from `logits`, one row of the model's (rewritten in place by the
  // penalties, logit_bias and the sampling processors). With top_logprobs >= 0 it keeps the
  // pick's logprobs (of the row as given) for accept(): picks and accepted tokens pair up in
  // order, and picks not accepted are dropped at the next accept().
  int32_t pick(std::span<float> logits, PickScratch& scratch);
  // Appends `tokens` in order until one ends generation; returns how many it took (the one
  // that ended it included; 0 once ended). An eos ends without joining the output; a stop
  // string cuts the text before it; the end() says which.
  size_t accept(std::span<const int32_t> tokens);
  size_t accept(int32_t token) { return accept(std::span<const int32_t>(&token, 1)); }
  // Undoes the last n accepted tokens (text, end, counts, logprobs; not the Rng's draws).
  // Only tokens accepted since the last take() can go: what was reported stays.
  void rollback(size_t n);
  size_t can_roll_back() const { return undo_.size(); }
  // Hands over what accept() produced since the last take().
  GenerationDelta take(Release what);
  // The grammar's matcher (null without one).
  const GrammarMatcher* matcher() const { return matcher_ ? &*matcher_ : nullptr; }

 private:
  void accept_one(int32_t token, TokenLogprob* logprob);
  // The detokenizer: commits the text the new text_ids_ add once it is whole.
  void detokenize();
  void check_stop_strings();

  // What one accepted token changed, to undo it.
  struct Undo {
    size_t text_size, text_ids, prefix, read, emitted, tokens, logprobs;
    bool joined;                      // it went into input_ (not an eos)
    bool matched;                     // the grammar's matcher accepted it
    std::optional<std::string> text;  // the text before a rewrite or a cut by this token
  };

  GenerationParams p_;
  const Tokenizer* tok_;
  std::vector<int32_t> input_;
  size_t n_context_;
  int64_t completion_ = 0;
  std::optional<StopReason> end_;
  Rng rng_;
  std::vector<TokenLogprob> picked_;  // pick()'s logprobs, awaiting accept()
  // Incremental detokenization over text_ids_ (the generated ids the tokenizer knows):
  // text_ holds the text of text_ids_[0, read_) once it was whole; the window decoded again
  // starts at prefix_.
  std::vector<int32_t> text_ids_;
  std::string text_;
  size_t prefix_ = 0, read_ = 0;
  size_t emitted_ = 0;  // bytes of text_ released
  size_t hold_ = 0;     // bytes held back for stop strings: the longest - 1
  std::vector<int32_t> pending_tokens_;
  std::vector<TokenLogprob> pending_logprobs_;
  std::vector<Undo> undo_;  // one per token accepted since the last take()
  std::optional<GrammarMatcher> matcher_;
};

}  // namespace metrale
