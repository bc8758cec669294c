#pragma once
// The decoder layer of llama / mistral / qwen2 / qwen3:
//   x = norm(h); h += o_proj(attention(rope(qk_norm(q, k)), v)); x = norm(h); h += mlp(x)
// written once against the Backend ops, for decode rows and prefill chunks alike.
#include <cstdint>

#include "io/config/model_config.h"
#include "layers/forward_context.h"
#include "weights/dense_weights.h"

namespace metrale {

// Scratch rows one pass needs, carved once from backend memory for the largest pass
// (no allocation per step).
// q/k/v are column slices of one [R, Q + 2 KV] block and gate/up of one [R, 2 I] block, so
// a fused matrix writes them in one call and the unfused path writes the same places.
struct DenseScratch {
  Rows x;        // [R, H]  normed input of a sub-block
  Rows qkv;      // [R, Q + 2 KV]
  Rows q;        // [R, Q]  slices of qkv
  Rows k;        // [R, KV]
  Rows v;        // [R, KV]
  Rows attn;     // [R, Q]
  Rows gate_up;  // [R, 2 I]
  Rows gate;     // [R, I]  slices of gate_up
  Rows up;       // [R, I]

  // Views of the first n rows.
  DenseScratch first(int64_t n) const;
};

// Bytes of scratch for passes of up to `max_rows` rows, and the views into `base`.
size_t dense_scratch_bytes(const ModelConfig& config, int64_t max_rows);
DenseScratch dense_scratch_at(void* base, const ModelConfig& config, int64_t max_rows);

class DenseLayer {
 public:
  DenseLayer(const ModelConfig& config, const DenseLayerWeights& weights, int64_t index);

  // Runs the layer on ctx.n_rows rows of `r` (h and delta of n_rows rows). On return the
  // MLP output is pending in r.delta.
  void forward(const ForwardContext& ctx, const LayerState& state, Residual& r,
               const DenseScratch& scratch) const;

  // The norm that opens this layer, alone: the model loop uses it to read h between layers.
  const NormWeight& input_norm() const { return w_->input_norm; }

 private:
  const DenseLayerWeights* w_;
  int64_t n_heads_, n_kv_heads_, head_dim_;
  float eps_;
  NormStyle norm_style_;
  AttentionShape shape_;
  Activation act_;
};

}  // namespace metrale
