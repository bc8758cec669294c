#pragma once
// The feed-forward blocks: a dense gated MLP, and a mixture of experts whose router picks
// top_k gated-MLP experts per row (Qwen3-MoE), optionally beside one shared expert scaled by
// sigmoid(shared_expert_gate(x)) (Qwen3-Next, Qwen3.5-MoE). Other routers are fields to add.
#include <memory>
#include <string>
#include <vector>

#include "io/config/model_config.h"
#include "layers/block.h"
#include "layers/linear.h"

namespace metrale {

Activation activation_for(const ModelConfig& config);

// down(act(gate(x)) * up(x)).
class DenseFfn final : public Ffn {
 public:
  // Reads prefix + {gate,up,down}_proj of width `intermediate` (or prefix + gate_up_proj
  // [2 intermediate, H], gate rows first, as GLM-4 ships it).
  static std::unique_ptr<DenseFfn> load(const ModelConfig& config, TensorLoader& loader,
                                        const std::string& prefix, int64_t intermediate);

  void record(Graph& g, const BlockIo& io) const override;
  std::string describe() const override;
  uint64_t active_bytes_per_token() const override;
  void lora_sites(LoraSites& out) override {
    out.linears.push_back(&gate_up_);
    out.linears.push_back(&down_);
  }

 private:
  Linear gate_up_;  // [2 I, H] gate_proj | up_proj
  Linear down_;     // [H, I]
  Activation act_ = Activation::kSilu;
};

// sum over the row's top_k experts e of weight_e * expert_e(x), with softmax routing, plus
// sigmoid(x . shared_expert_gate) * shared_expert(x) when the config has a shared expert; or
// (DeepSeek-V3, GLM-4.5) with group-limited sigmoid routing (RouteArgs) plus the ungated
// shared_experts MLP of width n_shared_experts * moe_intermediate_size.
class MoeFfn final : public Ffn {
 public:
  // Reads prefix + gate.weight (the router) and the experts, in either layout:
  //  - published checkpoints: prefix + experts.E.{gate,up,down}_proj.weight per expert;
  //  - transformers 5 save_pretrained: prefix + experts.gate_up_proj [E, 2I, H] (gate rows
  //    first) and prefix + experts.down_proj [E, H, I];
  //  - qwen3_vl_moe's published checkpoints: the same tensors transposed, [E, H, 2I] (gate
  //    columns first) and [E, I, H] (either layout per tensor, told apart by shape);
  // and, with a shared expert, prefix + shared_expert.{gate,up,down}_proj and
  // prefix + shared_expert_gate.weight [1, H]; sigmoid routers also prefix +
  // gate.e_score_correction_bias [E] and prefix + shared_experts.{gate,up,down}_proj.
  static std::unique_ptr<MoeFfn> load(const ModelConfig& config, TensorLoader& loader,
                                      const std::string& prefix);

  void record(Graph& g, const BlockIo& io) const override;
  std::string describe() const override;
  uint64_t active_bytes_per_token() const override;
  void lora_sites(LoraSites& out) override;

  int64_t n_experts() const { return static_cast<int64_t>(experts_.size()); }
  int64_t top_k() const { return top_k_; }

 private:
  Linear router_;  // [E, H] gate.weight
  std::vector<MoeExpertWeights> experts_;
  int64_t top_k_ = 0;
  bool normalize_ = false;
  Activation act_ = Activation::kSilu;
  std::unique_ptr<DenseFfn> shared_;  // null: no shared expert
  Linear shared_gate_;                // [1, H]; empty: the shared expert is ungated
  // kSigmoid (DeepSeek-V3, GLM-4.5): group-limited choice by sigmoid + correction bias.
  RouteScoring scoring_ = RouteScoring::kSoftmax;
  DeviceFloats correction_bias_;  // [E] gate.e_score_correction_bias
  int64_t n_group_ = 1, topk_group_ = 1;
  // LoRA on the experts (lora/lora_pool.h attaches them; null: none).
  std::string prefix_;  // "model.layers.0.mlp."
  const LoraWeights* expert_lora_gate_up_ = nullptr;
  const LoraWeights* expert_lora_down_ = nullptr;
  float scale_ = 1.0f;  // routed_scaling_factor
};

}  // namespace metrale
