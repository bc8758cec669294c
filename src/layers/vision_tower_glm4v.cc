// GLM-4V's tower tail (Glm4vVisionModel after its blocks): post_layernorm, the downsample
// Conv2d over each merge block and the patch merger. The blocks and the patch embedding are
// vision_tower.cc's.
#include <string>
#include <vector>

#include "layers/vision_tower.h"

namespace metrale {
namespace {

// nn.LayerNorm(dim) of Glm4vVisionPatchMerger: torch's default eps.
constexpr float kMergerLayerNormEps = 1e-5f;

}  // namespace

void VisionTower::load_glm_head(TensorLoader& l, const std::string& p) {
  const VisionConfig& c = config_;
  const int64_t W = c.width, O = c.out_width, m = c.spatial_merge_size, M = c.merge_rows();
  glm_.post_conv_norm = l.norm(p + "post_conv_layernorm.weight", W);
  glm_.post_norm = l.norm(p + "post_layernorm.weight", W);
  // Conv2d [out, width, m, m] with kernel = stride = m over the merge block's m x m patches;
  // MergeRows lays a block out as its patches (row-major in the block) of width channels each,
  // so column (kh m + kw) W + ch of the linear is the kernel's [., ch, kh, kw].
  const std::string name = p + "downsample.weight";
  const std::vector<float> conv = l.floats(name, {O, W, m, m});
  std::vector<float> regrouped(conv.size());
  for (int64_t o = 0; o < O; ++o)
    for (int64_t ch = 0; ch < W; ++ch)
      for (int64_t k = 0; k < M; ++k) {
        regrouped[static_cast<size_t>((o * M + k) * W + ch)] =
            conv[static_cast<size_t>((o * W + ch) * M + k)];
      }
  glm_.downsample = l.derived_matrix(name, O, M * W, regrouped);
  glm_.downsample_bias = l.norm(p + "downsample.bias", O);
  glm_.downsample.bias = glm_.downsample_bias.data();
  glm_.downsample.bias_dtype = DType::kF32;
  const std::string g = p + "merger.";
  glm_.proj = l.linear(g + "proj", O, O, false);
  glm_.norm_w = l.norm(g + "post_projection_norm.weight", O);
  glm_.norm_b = l.norm(g + "post_projection_norm.bias", O);
  glm_.gate = l.linear(g + "gate_proj", c.merger_width, O, false);
  glm_.up = l.linear(g + "up_proj", c.merger_width, O, false);
  glm_.down = l.linear(g + "down_proj", O, c.merger_width, false);
}

void VisionTower::record_glm_head(Graph& g, Tensor h, Tensor out) const {
  const VisionConfig& c = config_;
  const int64_t W = c.width, O = c.out_width, I = c.merger_width;
  const Graph::Scope scope(g, "merger");
  const Tensor x = g.buffer("x", W);
  norm(g, h, x, glm_.post_norm, glm_.post_norm);  // post_layernorm (RMSNorm)
  const Tensor merged = g.buffer("merged", c.merge_rows() * W, RowSpace::kMerged);
  g.add(node::MergeRows{.x = x, .out = merged});
  const Tensor down = g.buffer("downsampled", O, RowSpace::kMerged);
  g.add(node::Linear{.x = merged, .w = &glm_.downsample, .y = down});
  const Tensor proj = g.buffer("proj", O, RowSpace::kMerged);
  g.add(node::Linear{.x = down, .w = &glm_.proj, .y = proj});
  g.add(node::LayerNorm{.x = proj,
                        .out = proj,
                        .weight = glm_.norm_w.data(),
                        .bias = glm_.norm_b.data(),
                        .eps = kMergerLayerNormEps});
  g.add(node::Activate{.x = proj, .out = proj, .act = Activation::kGelu});  // nn.GELU()
  const Tensor gate = g.buffer("gate", I, RowSpace::kMerged);
  const Tensor up = g.buffer("up", I, RowSpace::kMerged);
  g.add(node::Linear{.x = proj, .w = &glm_.gate, .y = gate});
  g.add(node::Linear{.x = proj, .w = &glm_.up, .y = up});
  g.add(node::GatedActivation{.gate = gate, .up = up, .out = gate, .act = act_});
  g.add(node::Linear{.x = gate, .w = &glm_.down, .y = out.cols(0, O)});
}

}  // namespace metrale
