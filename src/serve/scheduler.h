#pragma once
// The server's engine loop: continuous batching over one Model.
//
// One thread owns the Model and the PrefixCache and runs steps. Requests are submitted from
// any thread and join the running batch at a step boundary; each step carries one decode row
// per running stream plus prefill chunks of waiting prompts (at most prefill_chunk tokens of
// prefill per step), so long prompts never stall the streams already decoding. A request
// leaves the batch at the step it finishes, is cancelled (its client went away) or times
// out, and its pages go back at once (to the prefix cache when they hold whole pages).
//
// Memory: the KV pool (and for hybrid models the state pool, one slot per running stream) is
// the budget. A request is admitted when a stream slot is free and its prompt's pages fit
// beside what the running streams still need for theirs (after evicting unused cached
// prefixes); otherwise it waits in the queue, and when the
// queue holds max_queue requests submit() refuses with SchedulerBusy (HTTP 429). When decode
// runs out of pages mid-stream, the youngest running stream is preempted: its pages are
// released and it goes back to the head of the queue with its generated tokens, to be
// recomputed (vLLM's recompute preemption); its output is unchanged. It is re-admitted only
// after a step ran without it, so every step makes progress.
//
// Results are those of the same request run alone: the engine's steps are batch-invariant,
// each stream samples from its own seeded Rng, and prefix-cache hits reuse bit-identical KV.
//
// Embedding requests (ServeRequest::embedding) are the same kind of stream without the
// decode: their input is prefilled in chunks beside the other streams' rows, its pooled rows
// (StepItem::pool) summed across the chunks, and the stream ends with the embedding when the
// last chunk ran. They are admitted, preempted and cancelled like any stream (up to
// max_embedding_seqs at once), and adopt a cached prefix only under last-token pooling, where
// the adopted tokens' hidden states are not needed.
//
// What a stream picks, when it ends and which text is final is its Generation's
// (engine/generation.h), the same object Session runs; the scheduler only runs the steps.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/embedding.h"
#include "engine/generation.h"
#include "engine/model.h"
#include "engine/multimodal.h"
#include "engine/sampling.h"
#include "engine/speculation.h"
#include "serve/prefix_cache.h"
#include "speculative/mtp_carry.h"

namespace metrale {

inline constexpr size_t kMaxLogitBias = 1024;  // entries in ServeRequest::logit_bias

// What an embedding request asks for (ServeRequest::embedding).
struct EmbeddingParams {
  int64_t dimensions = 0;  // 0: the whole embedding; else its first N values (renormalised)
};

struct ServeRequest {
  std::vector<int32_t> prompt;  // >= 1 token
  int64_t max_tokens = 16;      // >= 1; the stream also ends when the context is full
  SamplingParams sampling{.temperature = 0.0f};  // greedy unless temperature > 0
  // OpenAI's penalties, in [-2, 2], over the tokens generated so far (not the prompt): each
  // generated token's logit drops by presence_penalty once and by frequency_penalty per time
  // it was generated, before the sampling processors (and before a greedy pick), as vLLM.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) pairs, each id at most once and at
  // most kMaxLogitBias of them. A bias is added to its token's logit at every step, after the
  // penalties and before the sampling processors (and before a greedy pick), as OpenAI and
  // vLLM do; -100 all but bans a token, +100 all but forces it. Reported logprobs are not
  // biased (they stay the model's own, as vLLM's default).
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
  std::vector<int32_t> eos_ids;  // empty: default_eos_ids(model)
  bool ignore_eos = false;
  std::vector<std::string> stop;         // stop strings: the text is cut before the first one
  bool skip_special_tokens = true;       // special tokens add no text (as Session)
  int top_logprobs = -1;                 // -1: no logprobs; k >= 0: the token's and k alternatives
  std::string adapter;                   // a LoRA adapter loaded in the model ("" = base)
  std::chrono::milliseconds timeout{0};  // 0: SchedulerOptions::request_timeout
  // false: this request decodes without drafts even when the server speculates (its output
  // is the same either way).
  bool speculative = true;
  // The conversation this request continues ("": none), as the client names it (HTTP: the
  // body's "session_id"). With MTP carry on, a request of a session adopts the drafter rows
  // the session's last request computed (speculative/mtp_carry.h) and prefills its drafter
  // only over the new span; the output is the same either way.
  std::string session;
  // Structured outputs: the compiled grammar every token must keep the output inside (null:
  // unconstrained). Each choice gets a matcher of its own; it rolls back with the stream.
  std::shared_ptr<const CompiledGrammar> grammar;
  // Set: an embedding request (/v1/embeddings). The prompt is the input and nothing is
  // generated: its final hidden states are pooled (SchedulerOptions::embedding) in the same
  // steps as the generation rows, and the last event carries the embedding. The generation
  // fields above do not apply; adapter and timeout do.
  std::optional<EmbeddingParams> embedding;
  // Images and videos (vision-language models): `prompt` already holds each item's
  // placeholders (place_media) and `media` are the preprocessed items in placeholder order.
  // The tower encodes them when the request is first admitted (its output cached by content
  // hash, SchedulerOptions::vision_cache_bytes); the prefill rows take its output, the M-RoPE
  // positions and the rope delta decode carries. In the prefix cache the placeholder rows are
  // keyed by their item's content hash, so the same image hits and two images never alias.
  std::vector<vision::VisionItem> media;
};

enum class FinishReason : uint8_t {
  kStop,       // an eos token or a stop string
  kLength,     // max_tokens, or the context is full
  kCancelled,  // ServeStream::cancel()
  kTimeout,    // the request's deadline passed
  kError,      // the engine refused it (ServeEvent::error says why)
};
std::string_view finish_reason_name(FinishReason r);  // "stop", "length", ...

struct ServeUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the prefix cache supplied
  // Speculative decoding: whether the request decoded with drafts, how many draft tokens the
  // target verified and how many of them it accepted (OpenAI's accepted / rejected
  // prediction tokens).
  bool speculative = false;
  int64_t draft_tokens = 0, accepted_draft_tokens = 0;
};

// What a stream reports, in order. A token may add no text (a partial UTF-8 character, or
// text held back while it may still be the start of a stop string); text always arrives
// whole. The last event has done = true.
struct ServeEvent {
  std::string text;
  std::vector<int32_t> tokens;         // the tokens this event's text came from
  std::vector<TokenLogprob> logprobs;  // one per token when top_logprobs >= 0
  bool done = false;
  FinishReason finish = FinishReason::kStop;  // when done
  std::string error;                          // kError
  ServeUsage usage;                           // when done
  double time_to_first_token = 0;             // seconds from submit; on the first event
  std::vector<float> embedding;               // an embedding request's, on its last event
};

// One submitted request, shared by its client and the scheduler.
class ServeStream {
 public:
  int64_t id() const { return id_; }
  // Moves the events reported so far into `out`, waiting up to `wait` for the first one.
  // Returns false when there was none in time.
  bool next(std::vector<ServeEvent>& out, std::chrono::milliseconds wait);
  // The client is gone: the scheduler drops the request at its next step boundary (its
  // last event is then kCancelled).
  void cancel();
  bool cancelled() const;

 private:
  friend class Scheduler;
  explicit ServeStream(int64_t id) : id_(id) {}
  void push(ServeEvent event);

  int64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ServeEvent> events_;
  bool cancelled_ = false;
};

struct SchedulerOptions {
  int64_t max_seqs = 8;       // streams decoding at once (hybrid: <= LoadOptions::max_seqs)
  int64_t max_queue = 256;    // waiting requests beyond this: SchedulerBusy
  int64_t prefill_chunk = 0;  // prefill tokens per step; 0: the model's max_rows
  std::chrono::milliseconds request_timeout{std::chrono::minutes(10)};
  PrefixCacheOptions cache;
  // Set: the prefix cache records KV-cache events (serve/kv_events.h) and the engine thread
  // hands them over after each step, in order. It must not block (kvevents/'s publisher
  // queues them).
  std::function<void(std::vector<KvCacheEvent>)> kv_events;
  // Speculative decoding for every request that does not turn it off (engine/speculation.h);
  // no proposer: off. A proposer that reads the target's hidden states (MTP) gets them from
  // the steps: a speculating stream's prefill chunks then want every row's logits, which
  // records their final-norm rows, and it adopts no cached prefix (whose hiddens are not kept).
  SpeculationOptions speculation;
  // MTP carry: drafter rows the finished requests of sessions may keep for their session's
  // next request (0: carry off). The drafter's own KV pool must hold them beside the running
  // streams' (mtp_kv_tokens(model, max_seqs, drafts, carry_tokens)); past the budget the
  // least recently finished session's rows go first.
  int64_t carry_tokens = 0;
  // How embedding requests are pooled (engine/embedding_config.h); none: they are refused.
  std::optional<EmbeddingConfig> embedding;
  // Embedding inputs prefilled at once beside the max_seqs streams (hybrid models: streams
  // and inputs together hold at most the state pool's slots).
  int64_t max_embedding_seqs = 32;
  // The vision tower's outputs kept by content hash (bytes; 0: none kept).
  size_t vision_cache_bytes = size_t{256} << 20;
};

// submit() when the queue is full (HTTP 429) or the scheduler is stopping (HTTP 503).
class SchedulerBusy : public Error {
 public:
  SchedulerBusy(std::string what, bool stopping) : Error(std::move(what)), stopping_(stopping) {}
  bool stopping() const { return stopping_; }

 private:
  bool stopping_;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;
  int64_t requests_finished = 0, requests_cancelled = 0, requests_timed_out = 0;
  int64_t requests_failed = 0, requests_rejected = 0, preemptions = 0;
  int64_t prompt_tokens = 0, prefill_tokens = 0, generated_tokens = 0, steps = 0;
  int64_t kv_pages_total = 0, kv_pages_free = 0;
  // Free pages the prefix cache could give back at once (held by nothing but the cache): what a
  // router's "KV-cache usage" counts as free, as vLLM's does.
  int64_t kv_pages_evictable = 0;
  int64_t kv_page_tokens = 0;  // tokens per KV page
  // Media items admitted, those the vision tower encoded, and the others (its output cache
  // supplied them, or their rows lay inside the adopted cached prefix).
  int64_t media_items = 0, media_encoded = 0, media_cache_hits = 0;
  bool prefix_cache = false;  // whether prefixes are reused
  PrefixCacheStats cache;
  // LoRA: the pool's slots (0 without LoRA) and the adapters of the running and the waiting
  // requests (each name once, sorted; the base model is not listed).
  int64_t max_loras = 0;
  std::vector<std::string> running_adapters, waiting_adapters;
  // Speculative decoding: totals over all requests, and each finished speculative request's
  // acceptance (accepted / drafted, of those that drafted) as a histogram.
  SpeculationCounts speculation;
  static constexpr double kAcceptanceBuckets[] = {0.1, 0.25, 0.5, 0.75, 0.9, 1.0};
  int64_t acceptance_le[std::size(kAcceptanceBuckets)] = {};  // cumulative, as Prometheus's
  int64_t acceptance_count = 0;
  double acceptance_sum = 0;
  // MTP carry: each speculating request's outcome (by speculative::CarryOutcome), the drafter
  // rows adopted and the rows its drafter prefill computed, and the sessions' rows held now.
  int64_t carry_outcomes[6] = {};
  int64_t carry_rows_adopted = 0, drafter_prefill_rows = 0, carry_rows_held = 0;
};

class Scheduler {
 public:
  // Starts the engine thread. `model` must outlive the scheduler and be used by nothing
  // else meanwhile.
  Scheduler(Model& model, const SchedulerOptions& options);
  // Stops the thread; requests still queued or running end with kError "server stopping".
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates the request against the model (Error: empty prompt, ids out of range, a prompt
  // that cannot fit the context or the KV pool, bad sampling values, unknown adapter) and
  // queues it; SchedulerBusy when the queue is full.
  std::shared_ptr<ServeStream> submit(ServeRequest request);
  // Queues every request or none (one that fails validation, or a full queue, refuses them
  // all): the inputs of one embedding request. They may take the queue past max_queue.
  std::vector<std::shared_ptr<ServeStream>> submit_all(std::vector<ServeRequest> requests);
  SchedulerStats stats() const;
  const Model& model() const { return model_; }
  const SchedulerOptions& options() const { return options_; }
  // Drops every cached prefix no request uses (PrefixCache::clear), on the engine thread at its
  // next step boundary; waits up to `wait` for it. Returns the pages freed, or -1 when the
  // engine did not get to it in time.
  int64_t flush_prefix_cache(std::chrono::milliseconds wait);
  // How embedding requests are pooled; none: the scheduler refuses them.
  const std::optional<EmbeddingConfig>& embedding() const { return options_.embedding; }

 private:
  struct Active;
  using ActivePtr = std::unique_ptr<Active>;

  // Validates a request (submit's checks) and makes its Active.
  ActivePtr prepare(ServeRequest r) const;

  // The engine thread: loop() runs these in order, once per step.
  void loop();
  // Publishes the last step's figures, waits for work and takes the queued requests that were
  // cancelled or timed out into `expired`, and the flush requests; false when the scheduler
  // stops.
  bool wait_for_work(std::vector<ActivePtr>& expired);
  // Runs the flush_prefix_cache() requests wait_for_work() took: clears the prefix cache, hands
  // over its events and publishes before answering them.
  void run_flushes();
  // The prefix cache's events since the last call, to options_.kv_events.
  void emit_events();
  // Ends `expired` and the running streams that were cancelled or timed out.
  void reap(std::vector<ActivePtr>& expired);
  // Admission: queued requests join while a stream slot (or an embedding slot) is free and
  // their pages fit.
  void admit();
  // With nothing running after admit(), the head request can never fit: it fails.
  void refuse_unfittable_head();
  // Step building: the decode rows of decoding streams, then prefill chunks (an embedding
  // input's chunks pool their rows). False: no rows.
  bool build_step();
  // Paging / preemption: finds the step's pages (evicting cached prefixes, else preempting the
  // youngest stream). False when the step must be built again.
  bool reserve_pages();
  // Runs the step; false when it failed (its streams preempted or retired).
  bool run_step();
  // Post-processing: each stream's rows go to its Generation; events, ends, cache inserts.
  void post_process();
  // After a bug (not bad input): fails what was running, keeps serving the rest.
  void fail_running(const std::exception& e);
  // Stopping: every request still here ends with an error event.
  void shutdown();

  // The most rows a decoding stream adds to a step, each wanting logits: the token it accepted
  // last, and as many drafts as speculation may give it (what admission keeps room for; a
  // step's own drafts are the Speculator's plan). An embedding input never decodes: 0.
  int64_t decode_width(const Active& a) const;
  // MTP carry: decides what a's session carry gives it (counting the outcome when `count`: a
  // first admission) and returns the last adopted key (-1: none; a.carried is then set).
  int64_t plan_carry(Active& a, bool count);
  // Keeps a's drafter rows for its session's next request (retire), within carry_tokens.
  void keep_carry(Active& a);
  // Drops the drafts of the step being built (out of pages: plain decode rows first).
  bool drop_drafts();
  // Reports a's new tokens and text (and its end when `finish` is set).
  void report(Active& a, std::optional<FinishReason> finish, std::string error = {});
  // Ends `a` (admitted or not): its last event, its pages to the prefix cache and the pool.
  void retire(Active& a, FinishReason why, std::string error = {});
  // Releases the youngest running stream (not `keep`) back to the head of the queue.
  bool preempt_youngest(const Active* keep);
  void publish();  // stats_ from the engine's figures; under mu_
  // a's whole pages into the prefix cache, its media rows keyed by content hash.
  void cache_insert(const Active& a);
  // a's input as the prefix cache keys it (empty: its tokens).
  std::vector<int32_t> cache_key(const Active& a) const;
  // A media request's tower output for the items whose rows reach `from` (the rows before are
  // its adopted cached prefix), at each admission; false: it failed and was retired.
  bool encode_media(Active& a, int64_t from);

  Model& model_;
  SchedulerOptions options_;
  std::unique_ptr<PrefixCache> cache_;
  VisionEmbedCache vision_cache_;  // the engine thread's
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Active>> queue_;  // guarded by mu_
  bool stopping_ = false;                      // guarded by mu_
  // flush_prefix_cache() callers waiting for the engine thread; guarded by mu_.
  std::vector<std::shared_ptr<std::promise<int64_t>>> flushes_;
  int64_t next_id_ = 1;   // guarded by mu_
  SchedulerStats stats_;  // guarded by mu_

  // The engine thread's own (no lock).
  struct StepRows {
    Active* owner;
    bool decoding;       // decode rows, not a prefill chunk
    int64_t wanted;      // logits rows it asked for
    bool picks = false;  // a prefill chunk that ends the input: its last row is picked
  };
  std::vector<ActivePtr> running_;
  std::vector<std::shared_ptr<std::promise<int64_t>>> flushing_;  // taken from flushes_
  std::vector<StepItem> items_;                                   // the step being built
  std::vector<StepRows> step_rows_;                               // per item
  std::vector<int32_t> picks_;           // one stream's picks from its rows
  std::vector<DecodeStream*> decoding_;  // the step's decoding streams
  std::vector<float> logits_;
  std::vector<float> pooled_;  // [pooling items, H] the step's pooled sums
  std::vector<float> hidden_;  // [logits rows, H] their final-norm rows, when recorded
  // Rows [first, first + n) of hidden_.
  ConstRows hidden_rows(size_t first, size_t n) const;
  Speculator spec_;  // every decode row goes through it (without a proposer: plain decoding)
  struct Counts {
    int64_t steps = 0, prefill_tokens = 0, generated_tokens = 0, prompt_tokens = 0;
    int64_t finished = 0, cancelled = 0, timed_out = 0, failed = 0, preemptions = 0;
    int64_t media_items = 0, media_encoded = 0;
    SpeculationCounts speculation;
    int64_t acceptance_le[std::size(SchedulerStats::kAcceptanceBuckets)] = {};
    int64_t acceptance_count = 0;
    double acceptance_sum = 0;
    int64_t carry_outcomes[6] = {};
    int64_t carry_rows_adopted = 0, drafter_prefill_rows = 0;
  } counts_;
  // MTP carry: per session (its hash), the rows its last request left, least recent first.
  struct Carried {
    speculative::CarryRecord record;
    std::unique_ptr<speculative::ProposerState> state;  // nullptr: no rows (kNoHiddens)
  };
  std::vector<Carried> carried_;
  int64_t carry_rows_held_ = 0;
  std::thread thread_;
};

}  // namespace metrale
