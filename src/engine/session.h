#pragma once
// Generation on top of Model: prompt -> prefill -> sample -> decode ... until a stop
// condition, for one sequence (Session) or several decoded together in one step
// (generate_batch). What to pick, when to stop and which text is final is the per-stream
// Generation's (engine/generation.h); the decode steps, with or without speculative drafts,
// are the Speculator's (engine/speculation.h); these drive them. Text streams out as it becomes
// whole UTF-8, held back while it may still start a stop string.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generation.h"
#include "engine/model.h"
#include "engine/multimodal.h"
#include "engine/sampling.h"
#include "engine/speculation.h"

namespace metrale {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  // Token ids that end generation (and are not part of the output). Empty: the config's
  // eos ids (config.json + generation_config.json) and the tokenizer's eos.
  std::vector<int32_t> eos_ids;
  bool ignore_eos = false;
  // Generation ends when the decoded text contains one of these; the text is cut before it.
  std::vector<std::string> stop_strings;
  SamplingParams sampling{.temperature = 0.0f};  // greedy unless temperature > 0
  uint64_t seed = 0;
  // Speculative decoding (engine/speculation.h); no proposer: off. The output is the same
  // either way (greedy: token for token; sampled: for a seed, as the verify draws exactly the
  // plain picks' draws).
  SpeculationOptions speculation;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (without the eos that stopped it)
  // Their text (empty without a tokenizer), cut at a stop string; a reply that ends inside a
  // character ends with U+FFFD, as the tokenizer's decode of the tokens shows it.
  std::string text;
  StopReason stop = StopReason::kMaxTokens;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;      // from the first decode step to the end
  SpeculationCounts speculation;  // drafts fed and accepted (zeros without speculation)
};

// Called with each piece of text that became final (whole characters, not held back for a
// stop string; never empty), and at the end with the rest.
using TextCallback = std::function<void(std::string_view piece)>;

class Session {
 public:
  // `adapter`: a LoRA adapter loaded in the model's pool ("" = the base model).
  explicit Session(Model& model, const std::string& adapter = "");
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Sequence& sequence() { return seq_; }
  // Prefill `prompt` and generate. The sequence keeps its tokens, so a later generate()
  // continues the conversation from the cache. With a drafter that reads the target's hidden
  // states (MTP), the next generate() given the same proposer adopts this turn's drafter rows
  // (MTP carry, speculative/mtp_carry.h) and prefills the drafter over the new prompt only;
  // without the carry (another proposer, the sequence changed) a continued conversation
  // cannot speculate with such a drafter (an Error, as before). With drafter prefill off
  // (SpeculationOptions::drafter_prefill) nothing is carried and every turn may speculate: the
  // drafter starts at the prompt's last token.
  GenerateResult generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                          const TextCallback& on_text = nullptr);
  // The same for a prompt with images / videos (engine/multimodal.h); the sequence must be
  // empty (its rope delta belongs to this prompt).
  GenerateResult generate(const MultimodalPrompt& prompt, const GenerateOptions& options,
                          const TextCallback& on_text = nullptr);

 private:
  // Prefills `prompt` (through `media_prefill` when set: a prompt with images / videos) and
  // generates.
  GenerateResult run(std::span<const int32_t> prompt,
                     const std::function<void(std::span<float>)>& media_prefill,
                     const GenerateOptions& options, const TextCallback& on_text);

  // MTP carry: the drafter state the last turn left (keys 0..record.last_key over
  // record.tokens, which the sequence then held), the proposer it belongs to, and the target's
  // hidden row of the sequence's last token (the one row the next prefill does not compute).
  struct Carry;

  Model& model_;
  Sequence seq_;
  std::unique_ptr<Carry> carry_;
  int64_t carry_rows_adopted_ = 0;

 public:
  // Drafter rows the last generate() adopted from the turn before (0: none; tests, bench).
  int64_t carry_rows_adopted() const { return carry_rows_adopted_; }
};

// Generates for several prompts at once: each decode step runs every unfinished sequence in
// one pass. Results are identical to generating each prompt alone. adapters: empty, or one
// LoRA adapter name per prompt ("" = the base model), mixed freely within a step.
std::vector<GenerateResult> generate_batch(Model& model,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& options,
                                           const std::vector<std::string>& adapters = {});

// The eos set GenerateOptions resolves to for `model`.
std::vector<int32_t> default_eos_ids(const Model& model);

}  // namespace metrale
