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
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/embedding.h"
#include "engine/model.h"
#include "engine/sampling.h"
#include "serve/prefix_cache.h"

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
  // Set: an embedding request (/v1/embeddings). The prompt is the input and nothing is
  // generated: its final hidden states are pooled (SchedulerOptions::embedding) in the same
  // steps as the generation rows, and the last event carries the embedding. The generation
  // fields above do not apply; adapter and timeout do.
  std::optional<EmbeddingParams> embedding;
};

enum class FinishReason : uint8_t {
  kStop,       // an eos token or a stop string
  kLength,     // max_tokens, or the context is full
  kCancelled,  // ServeStream::cancel()
  kTimeout,    // the request's deadline passed
  kError,      // the engine refused it (ServeEvent::error says why)
};
std::string_view finish_reason_name(FinishReason r);  // "stop", "length", ...

struct TokenLogprob {
  int32_t id = 0;
  // log-softmax of the model's logits (before the penalties, logit_bias and sampling's
  // processors: a bias does not change reported logprobs, as vLLM's default)
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most likely, best first
};

struct ServeUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the prefix cache supplied
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
  // How embedding requests are pooled (engine/embedding_config.h); none: they are refused.
  std::optional<EmbeddingConfig> embedding;
  // Embedding inputs prefilled at once beside the max_seqs streams (hybrid models: streams
  // and inputs together hold at most the state pool's slots).
  int64_t max_embedding_seqs = 32;
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
  PrefixCacheStats cache;
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
  // How embedding requests are pooled; none: the scheduler refuses them.
  const std::optional<EmbeddingConfig>& embedding() const { return options_.embedding; }

 private:
  struct Active;
  void loop();
  // Validates a request (submit's checks) and makes its Active.
  std::unique_ptr<Active> prepare(ServeRequest r) const;

  Model& model_;
  SchedulerOptions options_;
  std::unique_ptr<PrefixCache> cache_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Active>> queue_;  // guarded by mu_
  bool stopping_ = false;                      // guarded by mu_
  int64_t next_id_ = 1;                        // guarded by mu_
  SchedulerStats stats_;                       // guarded by mu_
  std::thread thread_;
};

}  // namespace metrale
