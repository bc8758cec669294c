#pragma once
// OpProfiler: an OpObserver (backend.h) that adds up the wall time of each op call, keyed by
// op and, for weight ops, the weight's name with the layer index folded out
// ("model.layers.*.mlp.down_proj.weight"), so a pass reads as a table of where its time goes
// (`metrale bench --profile`). The CPU ops are synchronous, so wall time per call is the
// op's time. Not for the hot path of a normal run: it allocates when it first sees a key.
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace metrale {

class OpProfiler final : public OpObserver {
 public:
  struct Entry {
    std::string key;  // "linear model.layers.*.self_attn.o_proj.weight", "rms_norm", ...
    uint64_t calls = 0;
    double seconds = 0;
  };

  // Entries in order of first appearance; reset() clears the tallies.
  const std::vector<Entry>& entries() const { return entries_; }
  void reset();

  void begin(Op op, const WeightTensor* weight) override;
  void end(Op op, const WeightTensor* weight) override;

 private:
  using Clock = std::chrono::steady_clock;
  // Index of the entry for (op, weight name); weight names are cached by pointer.
  size_t slot(Op op, const WeightTensor* w);

  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_key_;
  std::unordered_map<const void*, size_t> by_weight_;
  size_t by_op_[kOpCount] = {};
  bool by_op_set_[kOpCount] = {};
  size_t open_slot_ = 0;
  Clock::time_point t0_;
};

}  // namespace metrale
