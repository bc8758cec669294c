#pragma once
// What a drafter may see of a sequence's context before drafting (issue 23, item 5):
//  - prefill: the drafter's KV is batch-prefilled over the prompt from the target's prompt
//    hidden states. Off: it computes no rows over the prompt — its first row is key P - 1 (the
//    first generated token with the prompt's last hidden, draft_proposer.h's numbering), then
//    the rows of what is decoded; it attends over those only, and drafts accept less often.
//  - carry (`mtp_carry`): a session's next turn adopts the previous turn's drafter rows and
//    prefills only the new span (mtp_carry.h). Its rows must begin at key 0, so a turn run
//    without prefill leaves none: the next turn reads kNoHiddens.
// Both are on by default. Each switch is set by a flag or an environment variable, whose value
// is "1" (on) or "0" (off); any other value — "true", "yes", " 1", the empty string — is an
// error naming the flag or variable, never silently read as either. A flag beats the
// environment; the list form (--drafter-context prefill,carry | prefill | carry | none) names
// the switches that are on, and a per-switch flag beats it.
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace metrale::speculative {

inline constexpr const char* kDrafterPrefillEnv = "METRALE_DRAFTER_PREFILL";
inline constexpr const char* kMtpCarryEnv = "METRALE_MTP_CARRY";

struct DrafterContext {
  bool prefill = true;
  bool carry = true;
};

// "1" -> true, "0" -> false; anything else throws naming `name` (a flag or a variable).
bool parse_switch(std::string_view name, std::string_view value);

// The list form: "prefill,carry", "prefill", "carry" or "none" (each switch at most once).
DrafterContext parse_drafter_context(std::string_view spec,
                                     std::string_view flag = "--drafter-context");

// The flags as given (nullopt: not given).
struct DrafterContextFlags {
  std::optional<std::string> context;  // --drafter-context LIST
  std::optional<std::string> prefill;  // --drafter-prefill 0|1
  std::optional<std::string> carry;    // --mtp-carry 0|1
};

// Returns the variable's value or nullptr when unset (std::getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

// Defaults, then the environment (METRALE_DRAFTER_PREFILL, METRALE_MTP_CARRY), then
// --drafter-context, then the per-switch flags.
DrafterContext resolve_drafter_context(const DrafterContextFlags& flags, const EnvLookup& env);

}  // namespace metrale::speculative
