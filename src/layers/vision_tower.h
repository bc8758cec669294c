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
// Qwen3-VL (Qwen3VLVisionModel): Qwen2-VL's LayerNorm blocks with a GELU(tanh) MLP
// (mlp.linear_fc1 / linear_fc2) and a Conv3d patch embedding with bias, plus learned position
// embeddings (pos_embed [side^2, width]) resampled to each item's (h, w) grid by
// align_corners bilinear interpolation (4 taps per patch: vision_pass_layout's pos_taps and
// pos_weights, one tap_sum node) and added to the patch embedding; the merger is norm /
// linear_fc1 / GELU / linear_fc2. After each block in deepstack_visual_indexes a deepstack
// merger (deepstack_merger_list.j: the merge first, then a LayerNorm over merge^2 width) writes
// its features; out's row for a merged patch is [merger | deepstack 0 | deepstack 1 | ...]
// (out_cols() wide), the language model adds deepstack j to layer j's input at the placeholder
// rows. Qwen3.5 (Qwen3_5VisionModel): the same tower without deepstack mergers.
// GLM-4V (Glm4vVisionModel): the Conv3d patch embedding (with bias), post_conv_layernorm
// (RMSNorm), plus learned position embeddings (embeddings.position_embedding [side^2, width],
// side = image_size / patch_size) resampled to each item's grid as F.grid_sample does it
// (bicubic, A = -0.75, align_corners=False, border padding: 16 taps per patch, one tap_sum
// node); blocks of RMSNorm (rms_norm_eps), qkv (bias: attention_bias), the 2-D rotary,
// proj without bias, and a SiLU-gated MLP of width out_hidden_size without biases; then
// post_layernorm, the downsample Conv2d (kernel = stride = merge: a linear over the merged row,
// its weight [out, width, m, m] regrouped at load to the merged row's (patch, channel) order)
// and the merger: proj, LayerNorm (eps 1e-5), GELU, down(act(gate(x)) * up(x)) of width
// intermediate_size.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
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
  // With a learned position table (transformers' get_vision_interpolation_indices_and_weights,
  // bilinear, align_corners): [n_rows * 4] taps (h_tap * side + w_tap) and their weights;
  // GLM-4V's bicubic grid_sample: [n_rows * 16] (4 h taps x 4 w taps, h major).
  std::vector<int32_t> pos_taps;
  std::vector<float> pos_weights;
};
// `window`: merged patches per window side (window_size / merge / patch_size), 0 for none.
// Throws Error naming the grid when a size is not positive or h, w are not multiples of merge.
// `pos_side`: the side of a learned square position table to interpolate (Qwen3-VL), 0 for
// none; pos_taps / pos_weights then hold 4 (table row, weight) pairs per row, or 16 with
// `bicubic` (GLM-4V).
VisionPassLayout vision_pass_layout(std::span<const std::array<int64_t, 3>> grids, int64_t merge,
                                    int64_t window = 0, int64_t pos_side = 0, bool bicubic = false);

// F.grid_sample's bicubic weights (cubic convolution, A = -0.75) of the 4 taps floor(x) - 1 ..
// floor(x) + 2 around the unnormalised coordinate x, in its float32 arithmetic.
std::array<float, 4> bicubic_weights(float t);

class VisionTower {
 public:
  // The tower's tensors under `prefix` ("visual." for Qwen2-VL's checkpoints).
  static std::unique_ptr<VisionTower> load(const VisionConfig& config, TensorLoader& loader,
                                           const std::string& prefix);

  const VisionConfig& config() const { return config_; }
  // Merged patches per attention window side (Qwen2.5-VL), 0 without window attention.
  int64_t window() const;
  // The side of the learned position table (Qwen3-VL / Qwen3.5 / GLM-4V), 0 without one.
  int64_t pos_side() const;
  // Whether it is resampled bicubically (GLM-4V: 16 taps per patch) rather than bilinearly.
  bool pos_bicubic() const { return config_.tower == VisionTowerKind::kGlm4v; }
  // The width of out's rows: out_width for the merger, once more per deepstack merger.
  int64_t out_cols() const {
    return config_.out_width * (1 + static_cast<int64_t>(deepstack_.size()));
  }
  // Records the tower: `pixels` ([rows, patch_dim]) to `out` ([kMerged rows, out_width]).
  void record(Graph& g, Tensor pixels, Tensor out) const;

 private:
  struct Block {
    DeviceFloats norm1_w, norm1_b, norm2_w, norm2_b;  // biases: LayerNorm towers only
    WeightTensor qkv;                                 // [3 width, width] + bias
    WeightTensor proj;                                // [width, width] + bias
    WeightTensor fc1;  // [mlp_width, width] + bias (Qwen2.5-VL: gate_proj, Qwen3: linear_fc1)
    WeightTensor up;   // Qwen2.5-VL: up_proj [mlp_width, width] + bias
    WeightTensor fc2;  // [width, mlp_width] + bias (Qwen2.5-VL: down_proj)
    bool full_attention = true;  // Qwen2.5-VL: in fullatt_block_indexes
  };
  // A patch merger: the main one (its norm over width, before the merge) or a deepstack one
  // (Qwen3-VL: the norm over merge^2 width, after it).
  struct Merger {
    DeviceFloats norm_w, norm_b;  // [width] or [merge^2 width] (post-shuffle); norm_b: LayerNorm
    WeightTensor fc1;             // [merge^2 width, merge^2 width] + bias
    WeightTensor fc2;             // [out_width, merge^2 width] + bias
    bool post_shuffle = false;
  };
  // GLM-4V's tail after the blocks: post_layernorm, downsample, merger.
  struct GlmHead {
    DeviceFloats post_conv_norm;  // post_conv_layernorm.weight [width]
    DeviceFloats post_norm;       // post_layernorm.weight [width]
    WeightTensor downsample;      // [out_width, merge^2 width] + bias (regrouped Conv2d)
    DeviceFloats downsample_bias;
    WeightTensor proj;            // merger.proj [out_width, out_width]
    DeviceFloats norm_w, norm_b;  // merger.post_projection_norm [out_width] (LayerNorm)
    WeightTensor gate, up;        // merger.{gate,up}_proj [merger_width, out_width]
    WeightTensor down;            // merger.down_proj [out_width, merger_width]
  };
  void load_glm_head(TensorLoader& l, const std::string& prefix);
  void record_glm_head(Graph& g, Tensor h, Tensor out) const;

  // A LayerNorm (Qwen2-VL, Qwen3) or RMSNorm (Qwen2.5-VL, GLM-4V) node.
  void norm(Graph& g, Tensor x, Tensor out, const DeviceFloats& w, const DeviceFloats& b) const;
  // Records merger `m` over the stream `h` into `out` (kMerged rows, out_width).
  void record_merger(Graph& g, const Merger& m, Tensor h, Tensor out, bool windows) const;

  VisionConfig config_;
  Activation act_ = Activation::kQuickGelu;
  WeightTensor patch_embed_;  // [width, patch_dim] (+ bias: Qwen3)
  DeviceFloats patch_bias_;   // Qwen3: patch_embed.proj.bias [width] (patch_embed_.bias)
  DeviceFloats pos_embed_;    // Qwen3: pos_embed.weight [side^2, width]
  std::vector<Block> blocks_;
  Merger merger_;  // Qwen2: ln_q, mlp.0, mlp.2; Qwen3: norm, linear_fc1, linear_fc2
  // Qwen3-VL: (block index, its deepstack merger), ascending block index.
  std::vector<std::pair<int64_t, Merger>> deepstack_;
  GlmHead glm_;  // GLM-4V only
  // The 2-D rotary's rope_rows inputs: [h freqs | w freqs], each head_dim / 4.
  DeviceFloats inv_freq_;
  DeviceArray<int32_t> axes_;
};

}  // namespace metrale
