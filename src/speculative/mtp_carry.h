#pragma once
// MTP carry: a session's next turn adopts the drafter rows the previous turn computed and
// prefills the drafter only over the new span. This file is the bookkeeping, as pure logic;
// the drafter's pages and the target's hiddens are the engine's.
//
// Drafter row numbering (draft_proposer.h): the row of key k holds (embed(t_{k+1}), hidden_k)
// at RoPE position k + 1, hidden_k being the target's hidden after t_0..t_k. A row of key k is
// therefore valid for a new context exactly when that context agrees on t_0..t_{k+1}: with
// `common` tokens in common, keys 0..common - 2.
//
// usable_by(record, query): a record is adoptable by a query of the same non-zero session
// whose hiddens come from the same target (model and adapter: `hidden_source`), when the
// prompt shares at least 2 tokens with the record's context. It adopts keys 0..min(last_key,
// common - 2) and drops the record's rows past that. Every call reports one outcome:
//   kAdopted         rows adopted (adopt_through >= 0)
//   kNoCarry         nothing to carry: no record, or the request/record has no session (0)
//   kForeignSession  the record belongs to another session
//   kForeignHiddens  the record's rows came from another target's hiddens (another adapter)
//   kNoHiddens       the record holds no drafter rows (its turn ran without drafter prefill)
//   kPrefixMismatch  the same session, but fewer than 2 tokens in common
//
// plan_append(adopted_through, lo, prompt_len): the rows this turn's drafter prefill computes:
// keys first_key = max(adopted_through + 1, lo) .. prompt_len - 2, where `lo` is the first
// position whose target hidden this turn's prefill produces (the prefix cache may have resumed
// the target past the start — for hybrid targets from a recurrent-state snapshot, at a depth of
// at least marconi_min_tokens()). Keys in adopted_through + 1 .. lo - 1 have neither a carried
// row nor a hidden to compute one from: `missing` counts them (the drafter runs without them).
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace metrale::speculative {

enum class CarryOutcome : uint8_t {
  kAdopted,
  kNoCarry,
  kPrefixMismatch,
  kForeignHiddens,
  kForeignSession,
  kNoHiddens,
};

// "adopted", "no_carry", "prefix_mismatch", "foreign_hiddens", "foreign_session",
// "no_hiddens": the names metrics use.
std::string_view carry_outcome_name(CarryOutcome o);

// What a finished turn leaves behind for the next one.
struct CarryRecord {
  uint64_t session = 0;         // the session's hash (0: none; never carried)
  uint64_t hidden_source = 0;   // which target (model + adapter) computed the hiddens
  std::vector<int32_t> tokens;  // the context the rows were computed over: t_0 ...
  int64_t last_key = -1;        // rows hold keys 0..last_key (-1: none); <= tokens.size() - 2
};

struct CarryQuery {
  uint64_t session = 0;
  uint64_t hidden_source = 0;
  std::span<const int32_t> prompt;
};

struct CarryDecision {
  CarryOutcome outcome = CarryOutcome::kNoCarry;
  int64_t common = 0;          // tokens the prompt shares with the record's context
  int64_t adopt_through = -1;  // the last key adopted (-1: none)
  int64_t drop = 0;            // the record's rows past adopt_through (all of them if none)
};

// Throws when the record is inconsistent (a key without its t_{k+1}).
CarryDecision usable_by(const CarryRecord* record, const CarryQuery& query);

struct AppendPlan {
  int64_t first_key = 0;
  int64_t last_key = -1;  // prompt_len - 2
  int64_t count = 0;      // rows to compute: last_key - first_key + 1, or 0
  int64_t missing = 0;    // keys neither adopted nor computable
};

// Throws on arguments outside their ranges (adopted_through in -1..prompt_len - 2, lo >= 0,
// prompt_len >= 1).
AppendPlan plan_append(int64_t adopted_through, int64_t lo, int64_t prompt_len);

}  // namespace metrale::speculative
