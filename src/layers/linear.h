#pragma once
// Linear: every projection of every layer goes through this one call, y = x W^T (+ b). The
// weight is either one matrix (fused: q|k|v, gate|up, an expert's gate|up) or one tensor per
// part; either way part i fills columns [parts()[i].offset, + n_out) of y, so a caller (and
// LoRA, which attaches per part) never asks which one it got.
//
// LoRA: a slot pool (lora/lora_pool.h) attaches its weights to a part with attach_lora(); a
// graph recorded afterwards follows the product with one lora node per adapted part, which
// adds each row's adapter to that part's columns (and runs only in passes with LoRA rows).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "graph/graph.h"
#include "weights/tensor_loader.h"

namespace metrale {

class Linear {
 public:
  struct Part {
    std::string name;    // the checkpoint's prefix of this part ("model.layers.0.self_attn.k_proj")
    int64_t offset = 0;  // first output column of the part
    int64_t n_out = 0;
  };

  Linear() = default;
  // One matrix holding every part, rows in part order.
  static Linear fused(WeightTensor w, std::vector<Part> parts);
  // One tensor per part.
  static Linear separate(std::vector<WeightTensor> tensors, std::vector<Part> parts);

  // Records y = x W^T (+ b), then the attached parts' LoRA. x: [rows, n_in()], y: [rows,
  // n_out()].
  void record(Graph& g, Tensor x, Tensor y) const;

  // Adds `lora` (owned by the pool, which outlives this) to part `part`; nullptr detaches.
  void attach_lora(size_t part, const LoraWeights* lora);
  const LoraWeights* lora(size_t part) const { return part < lora_.size() ? lora_[part] : nullptr; }

  bool empty() const { return tensors_.empty(); }
  int64_t n_in() const { return n_in_; }
  int64_t n_out() const { return n_out_; }
  bool is_fused() const { return tensors_.size() == 1 && parts_.size() > 1; }
  std::span<const Part> parts() const { return parts_; }
  std::span<const WeightTensor> tensors() const { return tensors_; }
  // Bytes of the stored weights (what one pass over them reads).
  uint64_t bytes() const;

 private:
  std::vector<WeightTensor> tensors_;
  std::vector<Part> parts_;
  std::vector<const LoraWeights*> lora_;  // [parts] or empty
  int64_t n_in_ = 0, n_out_ = 0;
};

// Bytes of one weight's stored rows.
uint64_t weight_bytes(const WeightTensor& w);

// Loads `prefixes[i]`.weight ([n_outs[i], n_in], plus .bias when has_bias) as one Linear:
// fused into one matrix when the loader copies weights (one pass over the weights and one
// thread split for all parts), else one tensor per part read in place.
Linear load_linear(TensorLoader& loader, const std::vector<std::string>& prefixes,
                   const std::vector<int64_t>& n_outs, int64_t n_in, bool has_bias);
inline Linear load_linear(TensorLoader& loader, const std::string& prefix, int64_t n_out,
                          int64_t n_in, bool has_bias) {
  return load_linear(loader, std::vector<std::string>{prefix}, std::vector<int64_t>{n_out}, n_in,
                     has_bias);
}

}  // namespace metrale
