#pragma once
// What the two halves of Backend's public ops share (backend.cc: the language model's ops;
// backend_data_ops.cc: row movement, overlays, memory transfer and the vision tower's ops): the
// observer's bracket around an op and the shape checks whose messages name the operand.
// Internal to metrale_backend.
#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>

#include "backend/backend.h"
#include "core/error.h"

namespace metrale {

// Brackets one op call for the observer, if any.
class ObservedOp {
 public:
  ObservedOp(const Backend& b, Op op, const WeightTensor* w)
      : observer_(b.observer_), op_(op), w_(w) {
    if (observer_ != nullptr) observer_->begin(op_, w_);
  }
  ~ObservedOp() {
    if (observer_ != nullptr) observer_->end(op_, w_);
  }
  ObservedOp(const ObservedOp&) = delete;
  ObservedOp& operator=(const ObservedOp&) = delete;

 private:
  OpObserver* observer_;
  Op op_;
  const WeightTensor* w_;
};

namespace backend_checks {

// The operand `role` of `op` (on weight `name`, when not empty), for messages.
struct Operand {
  std::string_view op, name, role;
};
inline std::ostream& operator<<(std::ostream& os, const Operand& o) {
  os << o.op;
  if (!o.name.empty()) os << " '" << o.name << "'";
  return os << " " << o.role;
}

inline void check_rows(const Operand& what, ConstRows r, int64_t n_rows, int64_t n_cols) {
  METRALE_CHECK(r.data != nullptr || r.n_rows == 0, what, ": null data");
  METRALE_CHECK(r.n_rows == n_rows && r.n_cols == n_cols, what, ": expected [", n_rows, ", ",
                n_cols, "], found [", r.n_rows, ", ", r.n_cols, "]");
  METRALE_CHECK(r.stride >= r.n_cols, what, ": stride ", r.stride, " is smaller than its ",
                r.n_cols, " columns");
}

template <typename T>
void check_span(const Operand& what, std::span<T> s, int64_t n) {
  METRALE_CHECK(static_cast<int64_t>(s.size()) == n, what, ": expected ", n, " values, found ",
                s.size());
}

}  // namespace backend_checks
}  // namespace metrale
