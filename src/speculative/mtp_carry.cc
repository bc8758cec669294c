#include "speculative/mtp_carry.h"

#include <algorithm>

#include "core/error.h"

namespace metrale::speculative {

std::string_view carry_outcome_name(CarryOutcome o) {
  switch (o) {
    case CarryOutcome::kAdopted:
      return "adopted";
    case CarryOutcome::kNoCarry:
      return "no_carry";
    case CarryOutcome::kPrefixMismatch:
      return "prefix_mismatch";
    case CarryOutcome::kForeignHiddens:
      return "foreign_hiddens";
    case CarryOutcome::kForeignSession:
      return "foreign_session";
    case CarryOutcome::kNoHiddens:
      return "no_hiddens";
  }
  return "unknown";
}

CarryDecision usable_by(const CarryRecord* record, const CarryQuery& q) {
  CarryDecision d;
  if (record == nullptr) return d;  // kNoCarry
  const CarryRecord& r = *record;
  const auto n_tokens = static_cast<int64_t>(r.tokens.size());
  METRALE_CHECK(r.last_key >= -1 && r.last_key <= n_tokens - 2, "mtp carry: record key ",
                r.last_key, " needs token ", r.last_key + 1, ", but the record holds ", n_tokens,
                " tokens (keys -1..", n_tokens - 2, ")");
  const int64_t rows = r.last_key + 1;
  d.drop = rows;
  if (r.session == 0 || q.session == 0) return d;  // kNoCarry: not a session
  if (r.session != q.session) {
    d.outcome = CarryOutcome::kForeignSession;
    return d;
  }
  if (r.hidden_source != q.hidden_source) {
    d.outcome = CarryOutcome::kForeignHiddens;
    return d;
  }
  if (rows == 0) {
    d.outcome = CarryOutcome::kNoHiddens;
    return d;
  }
  const auto limit = std::min(r.tokens.size(), q.prompt.size());
  const auto mismatch = std::mismatch(r.tokens.begin(), r.tokens.begin() + limit, q.prompt.begin());
  d.common = mismatch.first - r.tokens.begin();
  if (d.common < 2) {
    d.outcome = CarryOutcome::kPrefixMismatch;
    return d;
  }
  d.outcome = CarryOutcome::kAdopted;
  d.adopt_through = std::min(r.last_key, d.common - 2);
  d.drop = r.last_key - d.adopt_through;
  return d;
}

AppendPlan plan_append(int64_t adopted_through, int64_t lo, int64_t prompt_len) {
  METRALE_CHECK(prompt_len >= 1, "mtp carry: plan_append: prompt length must be >= 1, found ",
                prompt_len);
  METRALE_CHECK(adopted_through >= -1 && adopted_through <= prompt_len - 2,
                "mtp carry: plan_append: adopted key must be in -1..", prompt_len - 2, ", found ",
                adopted_through);
  METRALE_CHECK(lo >= 0, "mtp carry: plan_append: lo must be >= 0, found ", lo);
  AppendPlan p;
  p.first_key = std::max(adopted_through + 1, lo);
  p.last_key = prompt_len - 2;
  p.count = std::max<int64_t>(p.last_key - p.first_key + 1, 0);
  // Keys adopted_through + 1 .. min(lo, last_key + 1) - 1 lack both a row and a hidden.
  p.missing = std::max<int64_t>(std::min(lo, p.last_key + 1) - (adopted_through + 1), 0);
  return p;
}

}  // namespace metrale::speculative
