#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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
// The longest session name a request may give.
constexpr size_t kMaxSessionBytes = 256;

// FNV-1a, never 0 (0 is "no session" to the carry).
uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

FinishReason finish_of(StopReason r) {
  return r == StopReason::kEos || r == StopReason::kStopString ? FinishReason::kStop
                                                               : FinishReason::kLength;
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
  std::string adapter;
  Clock::time_point submitted, deadline;
  Sequence seq;
  bool admitted = false;           // holds a Sequence in the model (running_)
  bool done = false;               // its last event is sent
  bool got_first = false;          // the first token has been reported
  int64_t cached_tokens = 0;       // prompt tokens adopted from the prefix cache (first admission)
  int64_t preempted_at_step = -1;  // the step count when it was last preempted
  // The prompt, the tokens generated so far (which survive a preemption), the pick, the
  // ends and the text. The model's input is gen.input(); a step's ids are a span of it.
  Generation gen;
  // Hybrid models: token counts where prefill chunks end so the prefix cache can snapshot.
  std::vector<int64_t> snapshot_points;
  // Speculative decoding: whether this request drafts, and its decode stream (the drafter's
  // state, begun once the prompt is prefilled, ended at a preemption; the counts survive it).
  bool speculative = false;
  DecodeStream ds;
  // A drafter that reads the target's hidden states (MTP): the final-norm rows of every token
  // prefilled so far, [tokens, hidden], handed to the drafter's prefill once the prompt ran.
  bool reads_hidden = false;
  std::vector<float> prompt_hidden;
  int64_t hidden_from = 0;  // the position of prompt_hidden's first row (a cached prefix's end)
  // MTP carry: the session's and the target's hashes, and the state adopted at admission
  // (its keys 0 .. carry_first_key - 1 hold), begun once the prompt ran.
  uint64_t session = 0, hidden_source = 0;
  std::unique_ptr<speculative::ProposerState> carried;
  int64_t carry_first_key = 0;
  bool counted = false;  // its prompt counted in the stats (its first admission)
  // Embedding requests: what was asked, the sum of the pooled rows' final hidden states so far,
  // and the embedding once the last chunk ran.
  std::optional<EmbeddingParams> embed;
  std::vector<float> pooled;
  std::vector<float> embedding;
  // Media requests: the items, their content hashes, the prompt's rows, positions and rope
  // delta (the tower's output once first admitted; kept across preemptions), the prompt as
  // the prefix cache keys it, and a prefill chunk's positions / embed rows.
  std::vector<vision::VisionItem> media;
  std::vector<uint64_t> hashes;
  std::unique_ptr<MultimodalPrompt> mm;
  std::vector<int32_t> key;
  std::vector<int32_t> chunk_pos3, chunk_rows;

  Active(GenerationParams params, std::vector<int32_t> prompt, const Tokenizer* tok)
      : gen(std::move(params), std::move(prompt), tok) {
    ds.seq = &seq;
    ds.gen = &gen;
  }

  bool embeds() const { return embed.has_value(); }
  int64_t input_size() const { return static_cast<int64_t>(gen.input().size()); }
};

// ---------------------------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(Model& model, const SchedulerOptions& options)
    : model_(model),
      options_(options),
      vision_cache_(options.vision_cache_bytes),
      spec_(model, options.speculation) {
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
  cache.events = static_cast<bool>(options_.kv_events);
  cache_ = std::make_unique<PrefixCache>(model_, cache);
  stats_.kv_pages_total = model_.kv_pool().layout().n_pages;
  stats_.kv_page_tokens = model_.kv_pool().layout().page_size;
  stats_.prefix_cache = cache_->enabled();
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

Scheduler::ActivePtr Scheduler::prepare(ServeRequest r) const {
  const auto n = static_cast<int64_t>(r.prompt.size());
  const int64_t vocab = model_.vocab_size();
  METRALE_CHECK(n >= 1, r.embedding ? "the input is empty" : "the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    METRALE_CHECK(r.prompt[i] >= 0 && r.prompt[i] < vocab, r.embedding ? "input" : "prompt",
                  " token ", i, " is ", r.prompt[i], ", outside the vocabulary [0, ", vocab, ")");
  }
  const KvLayout& kv = model_.kv_pool().layout();
  if (r.embedding) {
    METRALE_CHECK(r.media.empty(), "an embedding request takes no images or videos");
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
    // Nothing is generated: a Generation that ended before its first token holds the input.
    auto a =
        std::make_unique<Active>(GenerationParams{.max_tokens = 0}, std::move(r.prompt), nullptr);
    a->adapter = std::move(r.adapter);
    a->embed = r.embedding;
    a->submitted = Clock::now();
    a->deadline = a->submitted + (r.timeout.count() > 0 ? r.timeout : options_.request_timeout);
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
  METRALE_CHECK(r.session.size() <= kMaxSessionBytes, "session_id: at most ", kMaxSessionBytes,
                " bytes, found ", r.session.size());
  for (int32_t id : r.eos_ids) {
    METRALE_CHECK(id >= 0 && id < vocab, "eos id ", id, " is outside the vocabulary");
  }
  if (r.eos_ids.empty()) r.eos_ids = default_eos_ids(model_);

  GenerationParams params{.sampling = r.sampling,
                          .presence_penalty = r.presence_penalty,
                          .frequency_penalty = r.frequency_penalty,
                          .logit_bias = std::move(r.logit_bias),
                          .seed = r.seed,
                          .eos_ids = std::move(r.eos_ids),
                          .ignore_eos = r.ignore_eos,
                          .stop = std::move(r.stop),
                          .skip_special_tokens = r.skip_special_tokens,
                          .top_logprobs = r.top_logprobs,
                          .max_tokens = r.max_tokens,
                          .max_input = model_.context_limit(),
                          .end_shows_partial_char = false,
                          .grammar = std::move(r.grammar)};
  std::unique_ptr<MultimodalPrompt> mm;
  std::vector<uint64_t> hashes;
  std::vector<int32_t> key;
  if (!r.media.empty()) {
    // Every check but the tower's run (that waits for the engine thread).
    mm = std::make_unique<MultimodalPrompt>(plan_multimodal_prompt(model_, r.prompt, r.media));
    key = r.prompt;
    size_t row = 0;
    for (const vision::VisionItem& it : r.media) {
      hashes.push_back(media_hash(it));
      // Each placeholder row a negative id (no token's) from its item's hash and its index.
      for (int64_t k = 0; k < it.n_tokens(); ++k) {
        uint64_t h = (hashes.back() ^ static_cast<uint64_t>(k)) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        key[static_cast<size_t>(mm->embed_rows[row++])] =
            -1 - static_cast<int32_t>(h & 0x7FFFFFFEu);
      }
    }
  }
  auto a = std::make_unique<Active>(std::move(params), std::move(r.prompt), model_.tokenizer());
  a->media = std::move(r.media);
  a->hashes = std::move(hashes);
  a->mm = std::move(mm);
  a->key = std::move(key);
  a->adapter = std::move(r.adapter);
  a->speculative = r.speculative && spec_.on();
  a->reads_hidden = a->speculative && spec_.needs_hidden();
  a->session = r.session.empty() ? 0 : hash_name(r.session);
  // The drafter's rows are computed from the target's hiddens: the model with this adapter.
  a->hidden_source = hash_name("adapter:" + a->adapter);
  a->submitted = Clock::now();
  a->deadline = a->submitted + (r.timeout.count() > 0 ? r.timeout : options_.request_timeout);
  return a;
}

std::shared_ptr<ServeStream> Scheduler::submit(ServeRequest r) {
  std::vector<ServeRequest> one;
  one.push_back(std::move(r));
  return submit_all(std::move(one)).front();
}

std::vector<std::shared_ptr<ServeStream>> Scheduler::submit_all(std::vector<ServeRequest> rs) {
  METRALE_CHECK(!rs.empty(), "submit_all: no requests");
  std::vector<ActivePtr> prepared;
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

int64_t Scheduler::flush_prefix_cache(std::chrono::milliseconds wait) {
  auto done = std::make_shared<std::promise<int64_t>>();
  std::future<int64_t> freed = done->get_future();
  {
    std::lock_guard lock(mu_);
    if (stopping_) return -1;
    flushes_.push_back(std::move(done));
  }
  cv_.notify_all();
  if (freed.wait_for(wait) != std::future_status::ready) return -1;
  try {
    return freed.get();
  } catch (const std::future_error&) {  // the scheduler stopped first
    return -1;
  }
}

// ---------------------------------------------------------------------------------------------
// The engine thread. Everything below belongs to it; mu_ guards only queue_, stopping_ and
// stats_.

void Scheduler::loop() {
  for (;;) {
    emit_events();
    std::vector<ActivePtr> expired;  // queued requests that end without running
    if (!wait_for_work(expired)) break;
    run_flushes();
    try {
      reap(expired);
      admit();
      if (running_.empty()) {
        refuse_unfittable_head();
        continue;
      }
      if (!build_step() || !reserve_pages() || !run_step()) continue;
      post_process();
    } catch (const std::exception& e) {
      fail_running(e);
    }
  }
  shutdown();
}

int64_t Scheduler::decode_width(const Active& a) const {
  if (a.embeds()) return 0;  // an embedding input never grows past its input
  if (!a.speculative) return 1;
  int64_t drafts = spec_.options().ladder.num_drafts();
  if (const StatePool* state = model_.state_pool(); state != nullptr) {
    drafts = std::min(drafts, state->plan().ring_depth);
  }
  return 1 + drafts;
}

void Scheduler::publish() {
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.waiting = static_cast<int64_t>(queue_.size());
  stats_.steps = counts_.steps;
  stats_.prefill_tokens = counts_.prefill_tokens;
  stats_.generated_tokens = counts_.generated_tokens;
  stats_.prompt_tokens = counts_.prompt_tokens;
  stats_.requests_finished = counts_.finished;
  stats_.requests_cancelled = counts_.cancelled;
  stats_.requests_timed_out = counts_.timed_out;
  stats_.requests_failed = counts_.failed;
  stats_.preemptions = counts_.preemptions;
  stats_.media_items = counts_.media_items;
  stats_.media_encoded = counts_.media_encoded;
  stats_.media_cache_hits = counts_.media_items - counts_.media_encoded;
  stats_.kv_pages_free = model_.kv_pool().free_pages();
  stats_.kv_pages_evictable = cache_->enabled() ? cache_->evictable_pages() : 0;
  stats_.cache = cache_->stats();
  if (LoraPool* lora = model_.lora_pool()) {
    stats_.max_loras = lora->options().max_loras;
    auto names = [](auto&& requests) {
      std::vector<std::string> out;
      for (const auto& a : requests) {
        if (!a->adapter.empty()) out.push_back(a->adapter);
      }
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
      return out;
    };
    stats_.running_adapters = names(running_);
    stats_.waiting_adapters = names(queue_);
  }
  stats_.speculation = counts_.speculation;
  std::copy(std::begin(counts_.acceptance_le), std::end(counts_.acceptance_le),
            std::begin(stats_.acceptance_le));
  stats_.acceptance_count = counts_.acceptance_count;
  stats_.acceptance_sum = counts_.acceptance_sum;
  std::copy(std::begin(counts_.carry_outcomes), std::end(counts_.carry_outcomes),
            std::begin(stats_.carry_outcomes));
  stats_.carry_rows_adopted = counts_.carry_rows_adopted;
  stats_.drafter_prefill_rows = counts_.drafter_prefill_rows;
  stats_.carry_rows_held = carry_rows_held_;
}

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

bool Scheduler::wait_for_work(std::vector<ActivePtr>& expired) {
  std::unique_lock lock(mu_);
  publish();
  cv_.wait(lock,
           [&] { return stopping_ || !queue_.empty() || !running_.empty() || !flushes_.empty(); });
  if (stopping_) return false;
  flushing_.swap(flushes_);
  const auto now = Clock::now();
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->stream->cancelled() || now >= (*it)->deadline) {
      expired.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return true;
}

void Scheduler::run_flushes() {
  if (flushing_.empty()) return;
  const int64_t held = cache_->stats().pages_held;
  cache_->clear();
  emit_events();
  std::lock_guard lock(mu_);
  publish();  // stats() agrees with the flush once it returns
  for (const auto& f : flushing_) f->set_value(held - cache_->stats().pages_held);
  flushing_.clear();
}

void Scheduler::emit_events() {
  if (!options_.kv_events) return;
  std::vector<KvCacheEvent> events = cache_->take_events();
  if (!events.empty()) options_.kv_events(std::move(events));
}

void Scheduler::reap(std::vector<ActivePtr>& expired) {
  const auto now = Clock::now();
  for (auto& a : expired) {
    retire(*a, a->stream->cancelled() ? FinishReason::kCancelled : FinishReason::kTimeout);
  }
  for (auto it = running_.begin(); it != running_.end();) {
    Active& a = **it;
    if (a.stream->cancelled() || now >= a.deadline) {
      retire(a, a.stream->cancelled() ? FinishReason::kCancelled : FinishReason::kTimeout);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
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
    const bool may_attach = !a->embeds() || options_.embedding->pooling == Pooling::kLastToken;
    if (a->mm != nullptr && !encode_media(*a)) continue;
    const std::vector<int32_t> key = cache_key(*a);
    std::span<const int32_t> attachable = a->gen.input();
    if (a->reads_hidden) {
      const int64_t through = plan_carry(*a, !a->counted);
      attachable = attachable.first(static_cast<size_t>(through + 2 > 1 ? through + 2 : 0));
    }
    const std::span<const int32_t> attach_key =
        key.empty() ? std::span<const int32_t>()
                    : std::span<const int32_t>(key).first(attachable.size());
    const int64_t adopted =
        may_attach && !attachable.empty() ? cache_->attach(a->seq, attachable, attach_key) : 0;
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
    for (Active* a : decoders) {
      const auto len = static_cast<int64_t>(a->ds.ids.size());
      items_.push_back({.seq = &a->seq, .ids = a->ds.ids, .logits = LogitRows::kAll});
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
    const bool every_row = a.reads_hidden;
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
        if (a.prompt_hidden.size() != static_cast<size_t>(rows) * H) {
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

void Scheduler::fail_running(const std::exception& e) {
  std::fprintf(stderr, "metrale scheduler: %s; failing %zu running request(s)\n", e.what(),
               running_.size());
  for (auto& r : running_) {
    try {
      retire(*r, FinishReason::kError, std::string("internal error: ") + e.what());
    } catch (const std::exception&) {
      r->admitted = false;  // its sequence is left to the model's teardown
    }
  }
  running_.clear();
}

void Scheduler::shutdown() {
  std::deque<ActivePtr> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
  }
  for (auto& a : running_) retire(*a, FinishReason::kError, "server stopping");
  for (auto& a : left) retire(*a, FinishReason::kError, "server stopping");
  for (Carried& c : carried_) spec_.free(std::move(c.state));
  carried_.clear();
  carry_rows_held_ = 0;
  std::lock_guard lock(mu_);
  running_.clear();
  publish();
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
  report(a, why, std::move(error));
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

bool Scheduler::encode_media(Active& a) {
  a.seq.rope_delta = a.mm->rope_delta;
  if (!a.mm->embeds.empty()) return true;  // a preempted stream keeps its tower output
  try {
    counts_.media_items += static_cast<int64_t>(a.media.size());
    counts_.media_encoded += encode_multimodal_prompt(
        model_, *a.mm, a.media, options_.vision_cache_bytes > 0 ? &vision_cache_ : nullptr,
        a.hashes);
  } catch (const Error& e) {
    model_.release(a.seq);
    retire(a, FinishReason::kError, e.message());
    return false;
  }
  return true;
}

}  // namespace metrale
