#pragma once
// VisionTower: a vision-language checkpoint's vision encoder as a recording block. It records
// its ops into a Graph of its own, one row per patch: pixels [patches, patch_dim] in, the
// merged features [patches / merge^2, out_width] out (one row per language-model placeholder
// token). The pass's inputs come from the items' grids (vision_pass_layout): each patch's
// (0, h, w) rotary position in the processor's merge-block order, the segments attention
// stays within (one per image, one per temporal patch of a video) and the merged row count.
//
// Qwen2-VL (Qwen2VisionTransformerPretrainedModel, transformers 5.24):
//   patch_embed: Conv3d with kernel = stride = (T, P, P), i.e. a linear over the flattened
//                (C, T, P, P) patch (weight [width, C, T, P, P] read as [width, patch_dim]);
//   block:       h += proj(attn(rope2d(qkv(LayerNorm1(h)))));  h += fc2(act(fc1(LayerNorm2(h))))
//                LayerNorms eps 1e-6 with bias; non-causal attention per segment; the 2-D
//                rotary rotates each head by rotate_half with frequencies [h-axis | w-axis],
//                head_dim / 4 each (VisionRotaryEmbedding(head_dim / 2)), as rope_rows + rope;
//   merger:      mlp.2(GELU(mlp.0(view(LayerNorm_q(h), -1, merge^2 * width)))).
// Qwen2.5-VL (Qwen2_5_VisionTransformerPretrainedModel): the same with RMSNorm (eps 1e-6, no
// bias) for the blocks' and the merger's norms, a SwiGLU MLP with biases
// (down(silu(gate(x)) * up(x))), and window attention: the patches are first reordered into
// windows of (window_size / merge / patch)^2 merged patches (the pixel rows gathered in that
// order; the rotary positions follow), every block but fullatt_block_indexes attends within its
// window, and the merged rows go back to the original order at the end.
// Qwen3-VL / Qwen3.5's towers (learned position embeddings, deepstack) are not built yet: load()
// refuses them naming the model type.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "graph/graph.h"
#include "io/config/vision_config.h"
#include "weights/tensor_loader.h"

namespace metrale {

// The per-pass inputs of a tower pass over items with these grids (in order).
struct VisionPassLayout {
  int64_t n_rows = 0;               // patches: sum of t * h * w
  int64_t n_merged = 0;             // n_rows / merge^2
  std::vector<int32_t> positions3;  // [n_rows * 3] (0, h, w) per row (rope_rows' layout)
  std::vector<int32_t> row_index;   // [n_rows] 0, 1, ...
  std::vector<int32_t> cu_seqlens;  // [segments + 1] one segment per (item, temporal patch)
  // With windows (transformers' get_vision_window_index): rows run in window order, positions3
  // follows them; window_rows[r] is the patch row of row r, merged_inverse[i] the window-ordered
  // merged row of merged patch i, cu_window_seqlens the windows (empty ones dropped).
  std::vector<int32_t> window_rows;
  std::vector<int32_t> merged_inverse;
  std::vector<int32_t> cu_window_seqlens;
};
// `window`: merged patches per window side (window_size / merge / patch_size), 0 for none.
// Throws Error naming the grid when a size is not positive or h, w are not multiples of merge.
VisionPassLayout vision_pass_layout(std::span<const std::array<int64_t, 3>> grids, int64_t merge,
                                    int64_t window = 0);

class VisionTower {
 public:
  // The tower's tensors under `prefix` ("visual." for Qwen2-VL's checkpoints).
  static std::unique_ptr<VisionTower> load(const VisionConfig& config, TensorLoader& loader,
                                           const std::string& prefix);

  const VisionConfig& config() const { return config_; }
  // Merged patches per attention window side (Qwen2.5-VL), 0 without window attention.
  int64_t window() const;
  // Records the tower: `pixels` ([rows, patch_dim]) to `out` ([kMerged rows, out_width]).
  void record(Graph& g, Tensor pixels, Tensor out) const;

 private:
  struct Block {
    DeviceFloats norm1_w, norm1_b, norm2_w, norm2_b;  // biases: LayerNorm towers only
    WeightTensor qkv;                                 // [3 width, width] + bias
    WeightTensor proj;                                // [width, width] + bias
    WeightTensor fc1;            // [mlp_width, width] + bias (Qwen2.5-VL: gate_proj)
    WeightTensor up;             // Qwen2.5-VL: up_proj [mlp_width, width] + bias
    WeightTensor fc2;            // [width, mlp_width] + bias (Qwen2.5-VL: down_proj)
    bool full_attention = true;  // Qwen2.5-VL: in fullatt_block_indexes
  };
  // A LayerNorm (Qwen2-VL) or RMSNorm (Qwen2.5-VL) node.
  void norm(Graph& g, Tensor x, Tensor out, const DeviceFloats& w, const DeviceFloats& b) const;

  VisionConfig config_;
  Activation act_ = Activation::kQuickGelu;
  WeightTensor patch_embed_;  // [width, patch_dim], no bias
  std::vector<Block> blocks_;
  DeviceFloats ln_q_w_, ln_q_b_;  // ln_q_b_: LayerNorm towers only
  WeightTensor merger_fc1_;       // mlp.0: [merge^2 width, merge^2 width] + bias
  WeightTensor merger_fc2_;       // mlp.2: [out_width, merge^2 width] + bias
  // The 2-D rotary's rope_rows inputs: [h freqs | w freqs], each head_dim / 4.
  DeviceFloats inv_freq_;
  DeviceArray<int32_t> axes_;
};

}  // namespace metrale
