#include "backend/profiling_backend.h"

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

void ProfilingBackend::reset() {
  for (Entry& e : entries_) {
    e.calls = 0;
    e.seconds = 0;
  }
}

size_t ProfilingBackend::slot(Op op, const WeightTensor* w) {
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

void ProfilingBackend::add(size_t s, Clock::time_point t0) {
  entries_[s].seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  entries_[s].calls += 1;
}

void ProfilingBackend::linear(ConstRows x, const WeightTensor& w, Rows y) {
  const size_t s = slot(Op::kLinear, &w);
  const auto t0 = Clock::now();
  inner_->linear(x, w, y);
  add(s, t0);
}

void ProfilingBackend::embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out) {
  const size_t s = slot(Op::kEmbedding, nullptr);
  const auto t0 = Clock::now();
  inner_->embedding(table, ids, out);
  add(s, t0);
}

#define METRALE_PROFILED(method, op, Args)        \
  void ProfilingBackend::method(const Args& a) {  \
    const size_t s = slot(op, nullptr);           \
    const auto t0 = Clock::now();                 \
    inner_->method(a);                            \
    add(s, t0);                                   \
  }
METRALE_PROFILED(rms_norm, Op::kRmsNorm, RmsNormArgs)
METRALE_PROFILED(rope, Op::kRope, RopeArgs)
METRALE_PROFILED(kv_store, Op::kKvStore, KvStoreArgs)
METRALE_PROFILED(attention_decode, Op::kAttention, DecodeAttentionArgs)
METRALE_PROFILED(attention_prefill, Op::kAttention, PrefillAttentionArgs)
METRALE_PROFILED(gated_activation, Op::kGatedActivation, GatedActivationArgs)
#undef METRALE_PROFILED

void ProfilingBackend::argmax(ConstRows logits, std::span<int32_t> out) {
  const size_t s = slot(Op::kArgmax, nullptr);
  const auto t0 = Clock::now();
  inner_->argmax(logits, out);
  add(s, t0);
}

}  // namespace metrale
