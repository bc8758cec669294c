#pragma once
// Helpers shared by the sub-commands: id-list parsing, load progress, model loading with the
// common flags.
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/model.h"
#include "engine/speculation.h"
#include "speculative/drafter_context.h"

namespace metrale::cli {

// "1,2,3" -> {1, 2, 3}. Throws Error naming `flag` and the bad item.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag);
std::vector<int64_t> parse_count_list(const std::string& text, const std::string& flag);
std::vector<int64_t> parse_list_at_least(const std::string& text, const std::string& flag,
                                         int64_t min);

// Flags every model-running command takes.
struct ModelFlags {
  std::string dir;
  int threads = 0;
  int64_t kv_tokens = 0;
  int64_t max_rows = 128;
  std::string placement = "copy";
  std::string compute = "f32";
  int64_t max_seqs = 8;             // hybrid models: sequences holding a recurrent state at once
  std::string state_dtype = "f32";  // hybrid models: recurrent-state storage
  std::string kv_dtype = "f32";     // KV cache storage
  std::string state_budget;         // hybrid models: bytes for the state pool ("" = no limit)
  std::string executor = "layers";  // decode steps: the layer loop or the circuit's programs
  std::string fusion = "none";      // what the circuit's programs fuse (circuit/fusion.h)

  void add_to(CLI::App& cmd);
  LoadOptions load_options() const;
};

// LoRA flags: `--lora NAME=DIR` (repeatable) loads adapters into a slot pool, `--adapter NAME`
// picks the one the command runs with (default: the only one given, else the base model).
struct LoraFlags {
  std::vector<std::string> loras;
  std::string adapter;
  int64_t max_rank = 0;  // 0: the largest rank of the adapters given
  int64_t slots = 0;     // 0: as many as adapters given
  std::string dtype = "f32";

  // with_adapter: also --adapter (commands that run one adapter; `serve` lets each request
  // choose by its model name instead).
  void add_to(CLI::App& cmd, bool with_adapter = true);
  // Makes the pool and loads the adapters (pinned); returns the adapter to run ("" = base).
  std::string apply(Model& model) const;
};

// Speculative decoding: `--speculative ngram|mtp|off`, `--draft-tokens K`, `--draft-ladder
// SPEC` (n_max:drafts rungs, speculative/ladder.h), `--draft-tree SPEC` (a tree shape,
// speculative/draft_tree.h), `--dispatch-cap N`, and the n-gram lookup's `--ngram-min` /
// `--ngram-max`.
struct SpeculativeFlags {
  std::string kind = "off";
  int64_t draft_tokens = 4;
  int64_t ngram_min = 1, ngram_max = 4;
  std::string ladder;  // "": K drafts at every batch size
  std::string tree;    // --draft-tree SPEC (speculative/draft_tree.h); "": chains
  float branch_p = 0;  // --draft-branch-p: MTP trees' branch floor (MtpOptions::branch_min_prob)
  int64_t dispatch_cap = speculative::kDefaultDispatchCap;
  // What the drafter sees before drafting (speculative/drafter_context.h): --drafter-context
  // LIST, --drafter-prefill 0|1, --mtp-carry 0|1, and METRALE_DRAFTER_PREFILL /
  // METRALE_MTP_CARRY ("1" on, "0" off, anything else an error).
  speculative::DrafterContextFlags context;

  void add_to(CLI::App& cmd);
  bool on() const { return kind != "off"; }
  // The most rows one sequence's verify step adds: a tree's nodes, else K.
  int64_t max_drafts() const;
  // The switches, from the flags and the environment (an Error naming the flag or variable
  // for a value other than "0" / "1").
  speculative::DrafterContext drafter_context() const;
  // Checks what needs no model (the kind, the counts, the ladder's syntax); errors name the flag.
  void check() const;
  // The engine's options for `model` (off: no proposer). Throws an Error naming the flag for a
  // drafter the model cannot have (mtp without MTP layers).
  // `streams`: the sequences that decode together (serve: --max-seqs), which size the MTP
  // drafter's own KV pool.
  // `carry_tokens`: drafter rows kept for carried sessions beside them (serve).
  SpeculationOptions options(Model& model, int64_t streams = 1, int64_t carry_tokens = 0) const;
};

// Loads the model, drawing a progress line on stderr while weights stream in.
std::unique_ptr<Model> load_model(const ModelFlags& flags);

}  // namespace metrale::cli
