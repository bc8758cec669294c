#pragma once
// ProfilingBackend: a decorator that forwards every op to another backend and adds up the
// wall time of each call, keyed by op and, for weight ops, the weight's name with the layer
// index folded out ("model.layers.*.mlp.down_proj.weight"), so a decode step reads as a
// table of where its time goes (`metrale bench --profile`). The ops are synchronous on the
// CPU backend, so wall time per call is the op's time. Not for the hot path of a normal run:
// it allocates when it first sees a key.
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace metrale {

class ProfilingBackend final : public Backend {
 public:
  struct Entry {
    std::string key;     // "linear model.layers.*.self_attn.o_proj.weight", "rms_norm", ...
    uint64_t calls = 0;
    double seconds = 0;
  };

  explicit ProfilingBackend(Backend& inner) : inner_(&inner) {}

  // Entries in order of first appearance; reset() clears the tallies.
  const std::vector<Entry>& entries() const { return entries_; }
  void reset();

  std::string_view name() const override { return inner_->name(); }
  Buffer allocate(size_t bytes) override { return inner_->allocate(bytes); }
  bool supports(Op op, WeightFormat format, DType dtype) const override {
    return inner_->supports(op, format, dtype);
  }
  WeightTensor prepare(const WeightTensor& w, PrepareMode mode) override { return inner_->prepare(w, mode); }

  void linear(ConstRows x, const WeightTensor& w, Rows y) override;
  void embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out) override;
  void rms_norm(const RmsNormArgs& a) override;
  void rope(const RopeArgs& a) override;
  void kv_store(const KvStoreArgs& a) override;
  void attention_decode(const DecodeAttentionArgs& a) override;
  void attention_prefill(const PrefillAttentionArgs& a) override;
  void gated_activation(const GatedActivationArgs& a) override;
  void argmax(ConstRows logits, std::span<int32_t> out) override;

 private:
  using Clock = std::chrono::steady_clock;
  // Index of the entry for (op, weight name); weight names are cached by pointer.
  size_t slot(Op op, const WeightTensor* w);
  void add(size_t slot, Clock::time_point t0);

  Backend* inner_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_key_;
  std::unordered_map<const void*, size_t> by_weight_;
  size_t by_op_[16] = {};
  bool by_op_set_[16] = {};
};

}  // namespace metrale
