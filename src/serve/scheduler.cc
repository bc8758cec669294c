#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <utility>

#include "engine/session.h"

namespace metrale {
namespace {

using Clock = std::chrono::steady_clock;

// The most alternatives a token's logprobs list (OpenAI's cap).
constexpr int kMaxTopLogprobs = 20;
// The most stop strings one request may give.
constexpr size_t kMaxStopStrings = 16;
// How many already-reported tokens the incremental detokenizer decodes again with the new
// ones, so a token whose text depends on its neighbours (a leading space a decoder strips
// at the start, a character split over tokens) comes out as the whole sequence's decode.
constexpr size_t kDetokenizeContext = 6;
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Where `text` may be cut at or below `upto` without splitting a UTF-8 character.
size_t utf8_floor(const std::string& text, size_t upto) {
  while (upto > 0 && upto < text.size() && (static_cast<unsigned char>(text[upto]) & 0xC0) == 0x80)
    --upto;
  return upto;
}

}  // namespace

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kTimeout:
      return "timeout";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// ServeStream

bool ServeStream::next(std::vector<ServeEvent>& out, std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, wait, [&] { return !events_.empty(); })) return false;
  for (ServeEvent& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

void ServeStream::cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
}

bool ServeStream::cancelled() const {
  std::lock_guard lock(mu_);
  return cancelled_;
}

void ServeStream::push(ServeEvent event) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// One request from submit() to its last event. Only the engine thread touches it once queued.

struct Scheduler::Active {
  std::shared_ptr<ServeStream> stream;
  ServeRequest req;
  Clock::time_point submitted, deadline;
  Sequence seq;
  bool admitted = false;      // holds a Sequence in the model (running_)
  bool done = false;          // its last event is sent
  bool got_first = false;     // the first token has been reported
  int64_t cached_tokens = 0;  // prompt tokens adopted from the prefix cache (first admission)
  // The model's input: the prompt (its first n_prompt tokens), then every token sampled so
  // far, which survive a preemption. A stream is decoding when seq holds all of it but the
  // last token; a step's ids are a span of it.
  std::vector<int32_t> input;
  size_t n_prompt = 0;
  int64_t completion_tokens = 0;   // generated tokens, the one that stopped the stream too
  int64_t preempted_at_step = -1;  // the step count when it was last preempted
  Rng rng;
  // Incremental detokenization over text_ids (the generated ids the tokenizer knows; special
  // tokens skipped unless the request keeps them): text holds the text of text_ids[0, read) once it
  // was whole.
  std::vector<int32_t> text_ids;
  std::string text;
  size_t prefix = 0, read = 0;  // token offsets: decode window start, tokens already in text
  size_t emitted = 0;           // bytes of text reported
  size_t hold = 0;              // bytes held back for stop strings: longest stop string - 1
  std::vector<int32_t> pending_tokens;         // reported with the next event
  std::vector<TokenLogprob> pending_logprobs;  // one per pending token (top_logprobs >= 0)
  // Hybrid models: token counts where prefill chunks end so the prefix cache can snapshot.
  std::vector<int64_t> snapshot_points;
  bool counted = false;  // its prompt counted in the stats (its first admission)
  // Embedding requests: the sum of the pooled rows' final hidden states so far, and the
  // embedding once the last chunk ran.
  std::vector<float> pooled;
  std::vector<float> embedding;

  explicit Active(uint64_t seed) : rng(seed) {}

  bool embeds() const { return req.embedding.has_value(); }

  int64_t input_size() const { return static_cast<int64_t>(input.size()); }
  std::span<const int32_t> generated() const { return std::span(input).subspan(n_prompt); }
};

// ---------------------------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(Model& model, const SchedulerOptions& options)
    : model_(model), options_(options) {
  METRALE_CHECK(options_.max_seqs >= 1, "scheduler: max_seqs must be >= 1, found ",
                options_.max_seqs);
  METRALE_CHECK(options_.max_queue >= 0, "scheduler: max_queue must be >= 0, found ",
                options_.max_queue);
  METRALE_CHECK(options_.max_embedding_seqs >= 1,
                "scheduler: max_embedding_seqs must be >= 1, found ", options_.max_embedding_seqs);
  METRALE_CHECK(!options_.embedding || options_.embedding->dimension == model_.config().hidden_size,
                "scheduler: the embedding config (",
                options_.embedding ? options_.embedding->source : "", ") pools ",
                options_.embedding ? options_.embedding->dimension : 0,
                " values; the model's hidden size is ", model_.config().hidden_size);
  METRALE_CHECK(options_.prefill_chunk >= 0, "scheduler: prefill_chunk must be >= 0, found ",
                options_.prefill_chunk);
  METRALE_CHECK(options_.request_timeout.count() > 0,
                "scheduler: request_timeout must be positive");
  if (options_.prefill_chunk == 0 || options_.prefill_chunk > model_.max_rows())
    options_.prefill_chunk = model_.max_rows();
  if (const StatePool* states = model_.state_pool()) {
    METRALE_CHECK(options_.max_seqs <= states->plan().max_seqs, "scheduler: max_seqs ",
                  options_.max_seqs, " exceeds the recurrent-state pool's ",
                  states->plan().max_seqs, " slots (LoadOptions::max_seqs)");
  }
  // A model whose prompts must be prefilled in one step cannot resume from a cached prefix.
  PrefixCacheOptions cache = options_.cache;
  if (requires_single_chunk_prefill(model_.config())) cache.enabled = false;
  cache_ = std::make_unique<PrefixCache>(model_, cache);
  stats_.kv_pages_total = model_.kv_pool().layout().n_pages;
  stats_.kv_pages_free = model_.kv_pool().free_pages();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::unique_ptr<Scheduler::Active> Scheduler::prepare(ServeRequest r) const {
  const auto n = static_cast<int64_t>(r.prompt.size());
  const int64_t vocab = model_.vocab_size();
  METRALE_CHECK(n >= 1, r.embedding ? "the input is empty" : "the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    METRALE_CHECK(r.prompt[i] >= 0 && r.prompt[i] < vocab, r.embedding ? "input" : "prompt",
                  " token ", i, " is ", r.prompt[i], ", outside the vocabulary [0, ", vocab, ")");
  }
  const KvLayout& kv = model_.kv_pool().layout();
  if (r.embedding) {
    METRALE_CHECK(options_.embedding.has_value(), "this scheduler serves no embeddings");
    const EmbeddingConfig& c = *options_.embedding;
    check_dimensions(c, r.embedding->dimensions);
    const int64_t limit = max_embedding_tokens(model_, c);
    METRALE_CHECK(n <= limit, "the input has ", n, " tokens; at most ", limit, " fit (",
                  c.max_seq_length == limit ? "the model's max_seq_length" : "the model's context",
                  ")");
    const int64_t pages = (n + kv.page_size - 1) / kv.page_size;
    METRALE_CHECK(pages <= kv.n_pages, "the input needs ", pages, " KV pages of ", kv.page_size,
                  " tokens; the KV cache has ", kv.n_pages, " (raise --kv-budget)");
    METRALE_CHECK(r.timeout.count() >= 0, "timeout must be >= 0");
    auto a = std::make_unique<Active>(0);
    a->submitted = Clock::now();
    a->deadline = a->submitted + (r.timeout.count() > 0 ? r.timeout : options_.request_timeout);
    a->n_prompt = r.prompt.size();
    a->input = std::move(r.prompt);
    a->req = std::move(r);
    return a;
  }
  METRALE_CHECK(n < model_.context_limit(), "the prompt has ", n,
                " tokens; the model's context holds ", model_.context_limit(),
                " (prompt + at least one generated token)");
  const int64_t pages = (n + 1 + kv.page_size - 1) / kv.page_size;
  METRALE_CHECK(pages <= kv.n_pages, "the prompt needs ", pages, " KV pages of ", kv.page_size,
                " tokens; the KV cache has ", kv.n_pages, " (raise --kv-budget)");
  METRALE_CHECK(!requires_single_chunk_prefill(model_.config()) || n <= model_.max_rows(),
                model_.config().model_type, " prompts are prefilled in one step of at most ",
                model_.max_rows(), " tokens; this one has ", n);
  METRALE_CHECK(r.max_tokens >= 1, "max_tokens must be >= 1, found ", r.max_tokens);
  const SamplingParams& s = r.sampling;
  METRALE_CHECK(std::isfinite(s.temperature) && s.temperature >= 0,
                "temperature must be a finite number >= 0, found ", s.temperature);
  METRALE_CHECK(s.top_p > 0 && s.top_p <= 1, "top_p must be in (0, 1], found ", s.top_p);
  METRALE_CHECK(s.top_k >= 0, "top_k must be >= 0, found ", s.top_k);
  METRALE_CHECK(s.min_p >= 0 && s.min_p <= 1, "min_p must be in [0, 1], found ", s.min_p);
  METRALE_CHECK(std::isfinite(s.repetition_penalty) && s.repetition_penalty > 0,
                "repetition_penalty must be > 0, found ", s.repetition_penalty);
  for (const auto& [name, value] : {std::pair{"presence_penalty", r.presence_penalty},
                                    std::pair{"frequency_penalty", r.frequency_penalty}}) {
    METRALE_CHECK(std::isfinite(value) && value >= -2 && value <= 2, name,
                  " must be in [-2, 2], found ", value);
  }
  METRALE_CHECK(r.logit_bias.size() <= kMaxLogitBias, "logit_bias: at most ", kMaxLogitBias,
                " entries, found ", r.logit_bias.size());
  for (const auto& [id, bias] : r.logit_bias) {
    METRALE_CHECK(id >= 0 && id < vocab, "logit_bias: token id ", id,
                  " is outside the vocabulary [0, ", vocab, ")");
    METRALE_CHECK(std::isfinite(bias) && bias >= -100 && bias <= 100,
                  "logit_bias: the bias of token ", id, " must be in [-100, 100], found ", bias);
  }
  {
    std::vector<int32_t> ids;
    ids.reserve(r.logit_bias.size());
    for (const auto& entry : r.logit_bias) ids.push_back(entry.first);
    std::sort(ids.begin(), ids.end());
    const auto twice = std::adjacent_find(ids.begin(), ids.end());
    METRALE_CHECK(twice == ids.end(), "logit_bias: token id ", twice == ids.end() ? 0 : *twice,
                  " appears twice");
  }
  METRALE_CHECK(r.top_logprobs >= -1 && r.top_logprobs <= kMaxTopLogprobs,
                "top_logprobs must be in [0, ", kMaxTopLogprobs, "], found ", r.top_logprobs);
  METRALE_CHECK(r.stop.size() <= kMaxStopStrings, "at most ", kMaxStopStrings,
                " stop strings, found ", r.stop.size());
  for (const std::string& stop : r.stop) METRALE_CHECK(!stop.empty(), "a stop string is empty");
  METRALE_CHECK(r.timeout.count() >= 0, "timeout must be >= 0");
  for (int32_t id : r.eos_ids) {
    METRALE_CHECK(id >= 0 && id < vocab, "eos id ", id, " is outside the vocabulary");
  }
  if (r.eos_ids.empty()) r.eos_ids = default_eos_ids(model_);

  auto a = std::make_unique<Active>(r.seed);
  a->submitted = Clock::now();
  a->deadline = a->submitted + (r.timeout.count() > 0 ? r.timeout : options_.request_timeout);
  for (const std::string& stop : r.stop) a->hold = std::max(a->hold, stop.size() - 1);
  a->n_prompt = r.prompt.size();
  a->input = std::move(r.prompt);
  a->req = std::move(r);
  return a;
}

std::shared_ptr<ServeStream> Scheduler::submit(ServeRequest r) {
  std::vector<ServeRequest> one;
  one.push_back(std::move(r));
  return submit_all(std::move(one)).front();
}

std::vector<std::shared_ptr<ServeStream>> Scheduler::submit_all(std::vector<ServeRequest> rs) {
  METRALE_CHECK(!rs.empty(), "submit_all: no requests");
  std::vector<std::unique_ptr<Active>> prepared;
  prepared.reserve(rs.size());
  for (ServeRequest& r : rs) prepared.push_back(prepare(std::move(r)));
  std::vector<std::shared_ptr<ServeStream>> streams;
  {
    std::lock_guard lock(mu_);
    if (stopping_) throw SchedulerBusy("the server is stopping", /*stopping=*/true);
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) {
      ++stats_.requests_rejected;
      throw SchedulerBusy("the server is busy: " + std::to_string(queue_.size()) +
                              " requests are waiting (--max-queue); retry later",
                          /*stopping=*/false);
    }
    for (auto& a : prepared) {
      streams.push_back(std::shared_ptr<ServeStream>(new ServeStream(next_id_++)));
      a->stream = streams.back();
      queue_.push_back(std::move(a));
    }
    stats_.waiting = static_cast<int64_t>(queue_.size());
  }
  cv_.notify_all();
  return streams;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

// ---------------------------------------------------------------------------------------------
// The engine thread.

void Scheduler::loop() {
  // Everything here belongs to this thread; mu_ guards only queue_, stopping_ and stats_.
  std::vector<std::unique_ptr<Active>> running;
  std::vector<StepItem> items;
  std::vector<Active*> item_owner;
  std::vector<bool> item_decoding;
  std::vector<float> logits;
  std::vector<float> pooled;  // [pooling items, H] the step's pooled sums
  std::vector<float> logprob_scratch;
  std::vector<int32_t> penalty_ids;  // pick()'s scratch: the generated ids, sorted
  Sampler sampler(model_.vocab_size());
  const auto V = static_cast<size_t>(model_.vocab_size());
  const int64_t page = model_.kv_pool().layout().page_size;
  const int64_t H = model_.config().hidden_size;
  // Hybrid models: the state pool's slots bound streams and embedding inputs together.
  const int64_t state_slots =
      model_.state_pool() != nullptr ? model_.state_pool()->plan().max_seqs : 0;
  int64_t steps = 0, prefill_tokens = 0, generated_tokens = 0, prompt_tokens = 0;
  int64_t finished = 0, cancelled = 0, timed_out = 0, failed = 0, preemptions = 0;

  // Reports `a`'s pending tokens and text (and its end when `finish` is set).
  auto report = [&](Active& a, std::optional<FinishReason> finish, std::string error = {}) {
    ServeEvent e;
    if (finish.has_value() && *finish != FinishReason::kError &&
        *finish != FinishReason::kCancelled) {
      // Everything still held back for stop strings is final now.
      e.text = a.text.substr(std::min(a.emitted, a.text.size()));
      a.emitted = a.text.size();
    } else if (!finish.has_value()) {
      size_t upto = a.text.size() > a.hold ? a.text.size() - a.hold : 0;
      upto = utf8_floor(a.text, upto);
      if (upto > a.emitted) {
        e.text = a.text.substr(a.emitted, upto - a.emitted);
        a.emitted = upto;
      }
    }
    e.tokens = std::move(a.pending_tokens);
    e.logprobs = std::move(a.pending_logprobs);
    a.pending_tokens.clear();
    a.pending_logprobs.clear();
    if (!a.got_first && !e.tokens.empty()) {
      a.got_first = true;
      e.time_to_first_token = seconds_between(a.submitted, Clock::now());
    }
    if (finish.has_value()) {
      e.done = true;
      e.finish = *finish;
      e.error = std::move(error);
      e.embedding = std::move(a.embedding);
      e.usage = {.prompt_tokens = static_cast<int64_t>(a.n_prompt),
                 .completion_tokens = a.completion_tokens,
                 .cached_tokens = a.cached_tokens};
    } else if (e.tokens.empty()) {
      return;
    }
    a.stream->push(std::move(e));
  };

  // Ends `a` (admitted or not): its last event, its pages to the prefix cache and the pool.
  auto retire = [&](Active& a, FinishReason why, std::string error = {}) {
    if (a.done) return;
    a.done = true;
    report(a, why, std::move(error));
    if (a.admitted) {
      if (why != FinishReason::kError) cache_->insert(a.seq);
      model_.release(a.seq);
      a.admitted = false;
    }
    switch (why) {
      case FinishReason::kStop:
      case FinishReason::kLength:
        ++finished;
        break;
      case FinishReason::kCancelled:
        ++cancelled;
        break;
      case FinishReason::kTimeout:
        ++timed_out;
        break;
      case FinishReason::kError:
        ++failed;
        break;
    }
  };

  // Releases the youngest running stream (not `keep`) back to the head of the queue.
  auto preempt_youngest = [&](const Active* keep) -> bool {
    for (auto it = running.rbegin(); it != running.rend(); ++it) {
      if (it->get() == keep) continue;
      Active& a = **it;
      cache_->insert(a.seq);
      model_.release(a.seq);
      a.admitted = false;
      a.preempted_at_step = steps;
      ++preemptions;
      std::unique_ptr<Active> back = std::move(*it);
      running.erase(std::next(it).base());
      std::lock_guard lock(mu_);
      queue_.push_front(std::move(back));
      return true;
    }
    return false;
  };

  // Appends `token` to `a`'s output; returns the reason the stream ends, if it does.
  auto accept = [&](Active& a, int32_t token) -> std::optional<FinishReason> {
    ++a.completion_tokens;
    ++generated_tokens;
    const ServeRequest& r = a.req;
    if (!r.ignore_eos && std::find(r.eos_ids.begin(), r.eos_ids.end(), token) != r.eos_ids.end())
      return FinishReason::kStop;
    a.input.push_back(token);
    a.pending_tokens.push_back(token);
    const Tokenizer* tok = model_.tokenizer();
    // An id the tokenizer lacks (a padding row of a larger embedding, which random or
    // undertrained weights may pick) prints nothing, as the tokenizers library skips it.
    if (tok != nullptr && tok->id_to_token(token).has_value()) {
      a.text_ids.push_back(token);
      // Decode the new tokens with a few reported ones before them; the new text is what the
      // longer decode adds to the shorter one (vLLM's incremental detokenizer).
      const std::span<const int32_t> all(a.text_ids);
      const std::string before =
          tok->decode(all.subspan(a.prefix, a.read - a.prefix), r.skip_special_tokens);
      const std::string after = tok->decode(all.subspan(a.prefix), r.skip_special_tokens);
      if (!after.ends_with(kReplacementChar) && after.size() > before.size() &&
          after.starts_with(before)) {
        a.text += after.substr(before.size());
        a.read = a.text_ids.size();
        a.prefix = a.read > kDetokenizeContext ? a.read - kDetokenizeContext : 0;
      } else if (!after.ends_with(kReplacementChar) && !after.starts_with(before)) {
        // The window decodes differently from its start: decode everything once.
        const std::string whole = tok->decode(all, r.skip_special_tokens);
        a.text = whole;
        a.emitted = std::min(a.emitted, a.text.size());
        a.read = a.text_ids.size();
        a.prefix = a.read > kDetokenizeContext ? a.read - kDetokenizeContext : 0;
      }
      for (const std::string& stop : r.stop) {
        const size_t from = a.emitted > stop.size() ? a.emitted - stop.size() : 0;
        const size_t at = a.text.find(stop, from);
        if (at != std::string::npos) {
          a.text.resize(at);
          a.emitted = std::min(a.emitted, at);
          return FinishReason::kStop;
        }
      }
    }
    if (a.completion_tokens >= r.max_tokens) return FinishReason::kLength;
    if (a.input_size() >= model_.context_limit()) return FinishReason::kLength;
    return std::nullopt;
  };

  // The log-softmax of the raw logits `row` for the chosen token and its top alternatives.
  auto logprobs_of = [&](std::span<const float> row, int32_t token, int top) {
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
  };

  // Picks `a`'s next token from `row` (modified in place by the sampling processors).
  auto pick = [&](Active& a, std::span<float> row) -> int32_t {
    const SamplingParams& s = a.req.sampling;
    if (a.req.presence_penalty != 0.0f || a.req.frequency_penalty != 0.0f) {
      // Each distinct generated id once, with how often it was generated.
      const std::span<const int32_t> generated = a.generated();
      penalty_ids.assign(generated.begin(), generated.end());
      std::sort(penalty_ids.begin(), penalty_ids.end());
      for (size_t i = 0; i < penalty_ids.size();) {
        size_t j = i;
        while (j < penalty_ids.size() && penalty_ids[j] == penalty_ids[i]) ++j;
        row[static_cast<size_t>(penalty_ids[i])] -=
            a.req.presence_penalty + a.req.frequency_penalty * static_cast<float>(j - i);
        i = j;
      }
    }
    // logit_bias after the penalties, before the processors and the greedy pick. The row's
    // logprobs were copied before pick(): the bias does not change reported logprobs.
    for (const auto& [id, bias] : a.req.logit_bias) row[static_cast<size_t>(id)] += bias;
    // HF's repetition penalty counts the prompt too (its input_ids).
    const std::span<const int32_t> seen = s.repetition_penalty != 1.0f
                                              ? std::span<const int32_t>(a.input)
                                              : std::span<const int32_t>();
    if (s.temperature <= 0.0f) {
      if (s.repetition_penalty != 1.0f)
        sampler.process(row, {.temperature = 1.0f, .repetition_penalty = s.repetition_penalty},
                        seen);
      return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    }
    return sampler.sample(row, s, seen, a.rng);
  };

  // What stats() reports; under mu_.
  auto publish = [&] {
    stats_.running = static_cast<int64_t>(running.size());
    stats_.waiting = static_cast<int64_t>(queue_.size());
    stats_.steps = steps;
    stats_.prefill_tokens = prefill_tokens;
    stats_.generated_tokens = generated_tokens;
    stats_.prompt_tokens = prompt_tokens;
    stats_.requests_finished = finished;
    stats_.requests_cancelled = cancelled;
    stats_.requests_timed_out = timed_out;
    stats_.requests_failed = failed;
    stats_.preemptions = preemptions;
    stats_.kv_pages_free = model_.kv_pool().free_pages();
    stats_.cache = cache_->stats();
  };

  for (;;) {
    // 1. Publish the last step's figures, wait for work, take out what the queue must drop. take
    // the reaping decisions that need the queue.
    std::vector<std::unique_ptr<Active>> expired;  // queued requests that end without running
    {
      std::unique_lock lock(mu_);
      publish();
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !running.empty(); });
      if (stopping_) break;
      const auto now = Clock::now();
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->stream->cancelled() || now >= (*it)->deadline) {
          expired.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
    }
    try {
      const auto now = Clock::now();
      for (auto& a : expired) {
        retire(*a, a->stream->cancelled() ? FinishReason::kCancelled : FinishReason::kTimeout);
      }
      for (auto it = running.begin(); it != running.end();) {
        Active& a = **it;
        if (a.stream->cancelled() || now >= a.deadline) {
          retire(a, a.stream->cancelled() ? FinishReason::kCancelled : FinishReason::kTimeout);
          it = running.erase(it);
        } else {
          ++it;
        }
      }

      // 2. Admit queued requests while a stream slot is free and their prompts' pages fit.
      for (;;) {
        std::unique_ptr<Active> a;
        {
          std::lock_guard lock(mu_);
          if (queue_.empty()) break;
          const Active& head = *queue_.front();
          // Streams and embedding inputs have their own limits; hybrid models hold a state
          // slot for each of either.
          const auto n_embed = static_cast<int64_t>(std::count_if(
              running.begin(), running.end(), [](const auto& r) { return r->embeds(); }));
          const auto n_running = static_cast<int64_t>(running.size());
          if (head.embeds() ? n_embed >= options_.max_embedding_seqs
                            : n_running - n_embed >= options_.max_seqs)
            break;
          if (state_slots > 0 && n_running >= state_slots) break;
          // A stream preempted for pages waits for a step to run without it: re-admitted at
          // once, it would be preempted again by the same step, forever.
          if (head.preempted_at_step == steps) break;
          // Its input's pages, plus the pages the running streams still need for theirs (a
          // stream admitted but not yet prefilled holds none yet) and one page of headroom
          // each, so the step that follows can run.
          // (An embedding input never grows past its input.)
          int64_t need = (head.input_size() + (head.embeds() ? 0 : 1) + page - 1) / page;
          for (const auto& r : running) {
            need += std::max<int64_t>(0, (r->input_size() + page - 1) / page -
                                             static_cast<int64_t>(r->seq.block_table.size())) +
                    1;
          }
          if (model_.kv_pool().free_pages() < need && cache_->make_room(need) < need) break;
          a = std::move(queue_.front());
          queue_.pop_front();
        }
        try {
          model_.set_adapter(a->seq, a->req.adapter);
        } catch (const Error& e) {
          retire(*a, FinishReason::kError, e.message());
          continue;
        }
        // An embedding needs the hidden state of every token it pools: a cached prefix only
        // under last-token pooling (the prefix cache always leaves the last token to run).
        const bool may_attach = !a->embeds() || options_.embedding->pooling == Pooling::kLastToken;
        const int64_t adopted = may_attach ? cache_->attach(a->seq, a->input) : 0;
        a->snapshot_points = cache_->snapshot_points(a->seq, a->input);
        if (!a->counted) {  // first admission, not a preempted stream's return
          a->counted = true;
          a->cached_tokens = std::min(adopted, static_cast<int64_t>(a->n_prompt));
          prompt_tokens += static_cast<int64_t>(a->n_prompt);
        }
        if (a->embeds()) a->pooled.assign(static_cast<size_t>(H), 0.0f);  // (re)computed whole
        a->admitted = true;
        running.push_back(std::move(a));
      }
      if (running.empty()) {
        // Nothing could be admitted with an empty batch: the head request can never fit.
        std::unique_ptr<Active> head;
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
        continue;
      }

      // 3. Build the step: one decode row per decoding stream, then prefill chunks.
      items.clear();
      item_owner.clear();
      item_decoding.clear();
      int64_t rows = 0;
      int64_t prefill_budget = options_.prefill_chunk;
      for (int pass = 0; pass < 2; ++pass) {
        for (auto& owned : running) {
          Active& a = *owned;
          const auto have = static_cast<int64_t>(a.seq.tokens.size());
          const int64_t left = a.input_size() - have;
          const bool decoding = left == 1 && !a.embeds();
          if ((pass == 0) != decoding) continue;
          int64_t len = left;
          if (!decoding) {
            len = std::min({left, prefill_budget, model_.max_rows() - rows});
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
          } else if (rows >= model_.max_rows()) {
            continue;
          }
          const bool last = have + len == a.input_size();
          items.push_back({.seq = &a.seq,
                           .ids = std::span<const int32_t>(a.input).subspan(
                               static_cast<size_t>(have), static_cast<size_t>(len)),
                           .logits = last && !a.embeds() ? LogitRows::kLast : LogitRows::kNone,
                           .pool = a.embeds() ? pooled_rows(options_.embedding->pooling, have, len,
                                                            a.input_size())
                                              : PoolRows::kNone});
          item_owner.push_back(&a);
          item_decoding.push_back(decoding);
          rows += len;
        }
      }
      if (items.empty()) continue;

      // 4. Pages for the step: evict cached prefixes, then preempt the youngest streams.
      auto pages_needed = [&] {
        int64_t need = 0;
        for (const StepItem& it : items) {
          const auto total = static_cast<int64_t>(it.seq->tokens.size() + it.ids.size());
          need += std::max<int64_t>(
              0, (total + page - 1) / page - static_cast<int64_t>(it.seq->block_table.size()));
        }
        return need;
      };
      if (const int64_t need = pages_needed();
          model_.kv_pool().free_pages() < need && cache_->make_room(need) < need) {
        // Preempt the youngest stream and build the step again without it. Alone and still
        // out of pages, the oldest stream has used the whole KV budget: its context is full.
        if (!preempt_youngest(running.front().get())) {
          retire(*running.front(), FinishReason::kLength);
          running.clear();
        }
        continue;
      }

      // 5. Run it.
      int64_t n_want = 0;
      for (const StepItem& it : items) n_want += it.logits == LogitRows::kLast ? 1 : 0;
      logits.resize(static_cast<size_t>(n_want) * V);
      // Each pooling item's row starts from its sum so far (a mean over several chunks).
      pooled.clear();
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].pool == PoolRows::kNone) continue;
        const std::vector<float>& sum = item_owner[i]->pooled;
        pooled.insert(pooled.end(), sum.begin(), sum.end());
      }
      try {
        model_.step(items, logits, nullptr, pooled);
      } catch (const Error& e) {
        // The step changed no sequence. Out of pages (a shared page copied on write): make room
        // by preempting; anything else fails the step's requests.
        if (running.size() > 1 && preempt_youngest(running.front().get())) continue;
        for (Active* a : item_owner) retire(*a, FinishReason::kError, e.message());
        std::erase_if(running, [](const auto& a) { return !a->admitted; });
        continue;
      }
      ++steps;
      // 6. Sample, report, retire.
      int64_t w = 0;
      size_t k = 0;  // pooling items seen
      for (size_t i = 0; i < items.size(); ++i) {
        Active& a = *item_owner[i];
        const auto len = static_cast<int64_t>(items[i].ids.size());
        if (!item_decoding[i]) prefill_tokens += len;
        if (a.embeds()) {
          if (items[i].pool != PoolRows::kNone) {
            const auto row = pooled.begin() + static_cast<ptrdiff_t>(k++ * H);
            std::copy(row, row + static_cast<ptrdiff_t>(H), a.pooled.begin());
          }
          if (static_cast<int64_t>(a.seq.tokens.size()) < a.input_size()) {
            cache_->insert(a.seq);
            continue;
          }
          const Pooling p = options_.embedding->pooling;
          const bool means = p == Pooling::kMean || p == Pooling::kMeanSqrtLen;
          a.embedding = finish_embedding(*options_.embedding, a.pooled, means ? a.input_size() : 1,
                                         a.req.embedding->dimensions);
          retire(a, FinishReason::kStop);
          continue;
        }
        if (items[i].logits == LogitRows::kNone) {
          cache_->insert(a.seq);  // share the prompt's whole pages while it is still running
          continue;
        }
        std::span<float> row(logits.data() + static_cast<size_t>(w++) * V, V);
        // pick() rewrites the row with the penalties, logit_bias and the sampling processors;
        // logprobs are the model's own (not biased, as vLLM's default).
        if (a.req.top_logprobs >= 0) logprob_scratch.assign(row.begin(), row.end());
        const int32_t token = pick(a, row);
        if (len > 1) cache_->insert(a.seq);
        const size_t reported = a.pending_tokens.size();
        std::optional<FinishReason> end = accept(a, token);
        // An eos token ends the stream without being part of it, nor of the logprobs.
        if (a.req.top_logprobs >= 0 && a.pending_tokens.size() > reported)
          a.pending_logprobs.push_back(logprobs_of(logprob_scratch, token, a.req.top_logprobs));
        if (end.has_value()) {
          retire(a, *end);
        } else {
          report(a, std::nullopt);
        }
      }
      std::erase_if(running, [](const auto& a) { return !a->admitted; });
    } catch (const std::exception& e) {
      // A bug, not bad input (requests are validated at submit): fail what was running,
      // keep serving the rest.
      std::fprintf(stderr, "metrale scheduler: %s; failing %zu running request(s)\n", e.what(),
                   running.size());
      for (auto& r : running) {
        try {
          retire(*r, FinishReason::kError, std::string("internal error: ") + e.what());
        } catch (const std::exception&) {
          r->admitted = false;  // its sequence is left to the model's teardown
        }
      }
      running.clear();
    }
  }

  // Stopping: every request still here ends with an error event.
  std::deque<std::unique_ptr<Active>> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
  }
  for (auto& a : running) retire(*a, FinishReason::kError, "server stopping");
  for (auto& a : left) retire(*a, FinishReason::kError, "server stopping");
  std::lock_guard lock(mu_);
  running.clear();
  publish();
}

}  // namespace metrale
