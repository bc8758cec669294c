#include "speculative/drafter_context.h"

#include "core/error.h"

namespace metrale::speculative {

bool parse_switch(std::string_view name, std::string_view value) {
  if (value == "1") return true;
  if (value == "0") return false;
  throw make_error(name, ": expected \"1\" (on) or \"0\" (off), found '", value, "'");
}

DrafterContext parse_drafter_context(std::string_view spec, std::string_view flag) {
  if (spec == "none") return {.prefill = false, .carry = false};
  DrafterContext c{.prefill = false, .carry = false};
  bool seen_prefill = false;
  bool seen_carry = false;
  size_t start = 0;
  for (;;) {
    const size_t comma = spec.find(',', start);
    const std::string_view item = spec.substr(start, comma - start);
    if (item == "prefill" && !seen_prefill) {
      c.prefill = seen_prefill = true;
    } else if (item == "carry" && !seen_carry) {
      c.carry = seen_carry = true;
    } else if (item == "prefill" || item == "carry") {
      throw make_error(flag, ": '", item, "' appears twice in '", spec, "'");
    } else {
      throw make_error(flag, ": expected a list of prefill, carry (or none), found '", item,
                       "' in '", spec, "'");
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return c;
}

DrafterContext resolve_drafter_context(const DrafterContextFlags& flags, const EnvLookup& env) {
  DrafterContext c;
  if (env) {
    if (const char* v = env(kDrafterPrefillEnv)) c.prefill = parse_switch(kDrafterPrefillEnv, v);
    if (const char* v = env(kMtpCarryEnv)) c.carry = parse_switch(kMtpCarryEnv, v);
  }
  if (flags.context) c = parse_drafter_context(*flags.context);
  if (flags.prefill) c.prefill = parse_switch("--drafter-prefill", *flags.prefill);
  if (flags.carry) c.carry = parse_switch("--mtp-carry", *flags.carry);
  return c;
}

}  // namespace metrale::speculative
