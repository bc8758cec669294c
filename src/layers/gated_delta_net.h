#pragma once
// The Gated DeltaNet mixer of Qwen3-Next and Qwen3.5 (transformers 5.24's
// Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet), a linear attention with a recurrent state:
//
//   q|k|v|z|b|a = x W_in                     (one fused matrix, whatever the checkpoint layout)
//   q|k|v = silu(causal_conv1d(q|k|v))       (depthwise, kernel K, rolling state of K - 1 rows)
//   o = gated_delta_rule(q, k, v, a, b)      (l2-normed q, k; decay from A_log and dt_bias)
//   o = rms_norm(o) * w * silu(z)            (per value head)
//   out = o W_out
//
// The conv window and the [n_v_heads, k_head_dim, v_head_dim] state live in the engine's state
// blocks (LayerState::conv / ::ssm); the backend ops causal_conv and delta_rule read them at
// the start of a sequence's rows and write them after (backend.h).
//
// Checkpoint layouts, regrouped at load into q | k | v | z | b | a:
//  - qwen3_next: in_proj_qkvz [2 Hk Dk + 2 Hv Dv, H] grouped per key head ([q Dk | k Dk |
//    v r Dv | z r Dv] for each key head, r = Hv / Hk) and in_proj_ba [2 Hv, H] ([b r | a r]
//    per key head);
//  - qwen3_5 / qwen3_5_moe: in_proj_qkv [2 Hk Dk + Hv Dv, H], in_proj_z [Hv Dv, H],
//    in_proj_b [Hv, H], in_proj_a [Hv, H].
// Both: conv1d.weight [C, 1, K] (C = 2 Hk Dk + Hv Dv), A_log [Hv], dt_bias [Hv], norm.weight
// [Dv] (a plain multiplier, unlike the decoder norms), out_proj [H, Hv Dv].
#include <memory>
#include <string>
#include <vector>

#include "layers/block.h"
#include "layers/linear.h"
#include "layers/norm.h"

namespace metrale {

class GatedDeltaNet final : public Mixer {
 public:
  static std::unique_ptr<GatedDeltaNet> load(const ModelConfig& config, int64_t layer,
                                             TensorLoader& loader, const std::string& prefix);

  void record(Graph& g, const BlockIo& io) const override;
  std::string describe() const override;
  uint64_t active_bytes_per_token() const override;
  LayerStateShape state_shape() const override;

 private:
  int64_t conv_channels() const { return 2 * n_k_heads_ * k_dim_ + n_v_heads_ * v_dim_; }

  Linear in_proj_;        // [C + Hv Dv + 2 Hv, H]: q | k | v | z | b | a
  Linear out_proj_;       // [H, Hv Dv]
  DeviceFloats conv_w_;   // [K, C] (conv1d.weight transposed)
  DeviceFloats a_log_;    // [Hv]
  DeviceFloats dt_bias_;  // [Hv]
  Norm norm_;             // [Dv], gated by silu(z)
  int64_t n_k_heads_ = 0, n_v_heads_ = 0, k_dim_ = 0, v_dim_ = 0, kernel_ = 0;
};

}  // namespace metrale
