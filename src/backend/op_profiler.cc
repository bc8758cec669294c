#include "backend/op_profiler.h"

#include <cctype>

namespace metrale {
namespace {

// "model.layers.12.mlp.up_proj.weight" -> "model.layers.*.mlp.up_proj.weight": every run of
// digits between dots becomes '*', so the 28 layers of a model share one row.
std::string fold_layer_index(std::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    const bool at_field = i == 0 || name[i - 1] == '.';
    size_t j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (at_field && j > i && (j == name.size() || name[j] == '.')) {
      out += '*';
      i = j;
    } else {
      out += name[i++];
    }
  }
  return out;
}

}  // namespace

void OpProfiler::reset() {
  for (Entry& e : entries_) {
    e.calls = 0;
    e.seconds = 0;
  }
}

size_t OpProfiler::slot(Op op, const WeightTensor* w) {
  const auto o = static_cast<size_t>(op);
  if (w == nullptr && by_op_set_[o]) return by_op_[o];
  if (w != nullptr) {
    if (auto it = by_weight_.find(w->data); it != by_weight_.end()) return it->second;
  }
  std::string key(op_name(op));
  if (w != nullptr) key += " " + fold_layer_index(w->name);
  size_t index;
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    index = it->second;
  } else {
    index = entries_.size();
    entries_.push_back({key, 0, 0});
    by_key_.emplace(key, index);
  }
  if (w != nullptr) {
    by_weight_.emplace(w->data, index);
  } else {
    by_op_[o] = index;
    by_op_set_[o] = true;
  }
  return index;
}

void OpProfiler::begin(Op op, const WeightTensor* weight) {
  open_slot_ = slot(op, weight);
  t0_ = Clock::now();
}

void OpProfiler::end(Op /*op*/, const WeightTensor* /*weight*/) {
  Entry& e = entries_[open_slot_];
  e.seconds += std::chrono::duration<double>(Clock::now() - t0_).count();
  e.calls += 1;
}

}  // namespace metrale
