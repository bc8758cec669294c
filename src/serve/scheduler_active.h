#pragma once
// The scheduler's per-request state (Scheduler::Active) and the helpers its source files share
// (scheduler.cc: submission and the engine thread's loop; scheduler_step.cc: one step;
// scheduler_caches.cc: the carry, prefix-cache and vision-cache traffic). Internal to
// metrale_serve.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "serve/scheduler.h"

namespace metrale {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline FinishReason finish_of(StopReason r) {
  return r == StopReason::kEos || r == StopReason::kStopString ? FinishReason::kStop
                                                               : FinishReason::kLength;
}

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

}  // namespace metrale
