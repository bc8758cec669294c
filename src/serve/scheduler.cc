#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <span>
#include <utility>

#include "engine/session.h"
#include "serve/scheduler_active.h"

namespace metrale {
namespace {

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
// The engine thread. Everything below (and all of scheduler_step.cc and scheduler_caches.cc)
// belongs to it; mu_ guards only queue_, stopping_ and stats_.

void Scheduler::loop() {
  for (;;) {
    emit_events();
    std::vector<ActivePtr> expired;  // queued requests that end without running
    if (!wait_for_work(expired)) break;
    run_flushes();
    try {
      reap(expired);
      admit();
      {
        // What was admitted is running before any of its tokens reaches a client.
        std::lock_guard lock(mu_);
        publish();
      }
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

}  // namespace metrale
