#include "layers/vision_tower.h"

#include <cmath>

#include "core/error.h"

namespace metrale {
namespace {

Activation activation_of(const VisionConfig& c) {
  if (c.hidden_act == "silu") return Activation::kSilu;
  if (c.hidden_act == "gelu") return Activation::kGelu;
  if (c.hidden_act == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (c.hidden_act == "quick_gelu") return Activation::kQuickGelu;
  throw make_error(c.source, ": hidden_act '", c.hidden_act, "' is not supported");
}

// torch's nn.LayerNorm(eps=1e-6) of the blocks and the merger.
constexpr float kLayerNormEps = 1e-6f;

}  // namespace

VisionPassLayout vision_pass_layout(std::span<const std::array<int64_t, 3>> grids, int64_t merge) {
  METRALE_CHECK(merge >= 1, "vision pass: merge size ", merge);
  VisionPassLayout p;
  p.cu_seqlens.push_back(0);
  for (size_t i = 0; i < grids.size(); ++i) {
    const auto [t, h, w] = grids[i];
    METRALE_CHECK(t >= 1 && h >= 1 && w >= 1 && h % merge == 0 && w % merge == 0 &&
                      t * h * w <= (int64_t{1} << 24),
                  "vision pass: grid ", i, " = [", t, ", ", h, ", ", w,
                  "]: expected positive sizes (at most 2^24 patches) with h and w multiples of ",
                  merge);
    // transformers' get_vision_position_ids: (h, w) of each patch in merge-block order
    // (h-block, w-block, h-in-block, w-in-block), repeated for every temporal patch.
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t hb = 0; hb < h / merge; ++hb)
        for (int64_t wb = 0; wb < w / merge; ++wb)
          for (int64_t hi = 0; hi < merge; ++hi)
            for (int64_t wi = 0; wi < merge; ++wi) {
              p.positions3.insert(p.positions3.end(), {0, static_cast<int32_t>(hb * merge + hi),
                                                       static_cast<int32_t>(wb * merge + wi)});
            }
      // get_vision_cu_seqlens: one segment per temporal patch.
      p.n_rows += h * w;
      METRALE_CHECK(p.n_rows <= (int64_t{1} << 30), "vision pass: more than 2^30 patches");
      p.cu_seqlens.push_back(static_cast<int32_t>(p.n_rows));
    }
  }
  p.n_merged = p.n_rows / (merge * merge);
  p.row_index.resize(static_cast<size_t>(p.n_rows));
  for (int64_t r = 0; r < p.n_rows; ++r)
    p.row_index[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  return p;
}

std::unique_ptr<VisionTower> VisionTower::load(const VisionConfig& c, TensorLoader& l,
                                               const std::string& p) {
  METRALE_CHECK(c.tower == VisionTowerKind::kQwen2Vl, c.source, ": the ", c.model_type,
                " vision tower is not supported yet (only qwen2_vl's)");
  auto t = std::unique_ptr<VisionTower>(new VisionTower());
  t->config_ = c;
  t->act_ = activation_of(c);
  const int64_t W = c.width;
  // Conv3d [width, C, T, P, P], kernel = stride: a linear over the flattened (C, T, P, P) patch.
  const std::string embed = p + "patch_embed.proj.weight";
  const std::vector<float> conv =
      l.floats(embed, {W, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size});
  t->patch_embed_ = l.derived_matrix(embed, W, c.patch_dim(), conv);
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string b = p + "blocks." + std::to_string(i) + ".";
    Block blk;
    blk.norm1_w = l.norm(b + "norm1.weight", W);
    blk.norm1_b = l.norm(b + "norm1.bias", W);
    blk.norm2_w = l.norm(b + "norm2.weight", W);
    blk.norm2_b = l.norm(b + "norm2.bias", W);
    blk.qkv = l.linear(b + "attn.qkv", 3 * W, W, true);
    blk.proj = l.linear(b + "attn.proj", W, W, true);
    blk.fc1 = l.linear(b + "mlp.fc1", c.mlp_width, W, true);
    blk.fc2 = l.linear(b + "mlp.fc2", W, c.mlp_width, true);
    t->blocks_.push_back(std::move(blk));
  }
  const int64_t M = c.merge_rows() * W;
  t->ln_q_w_ = l.norm(p + "merger.ln_q.weight", W);
  t->ln_q_b_ = l.norm(p + "merger.ln_q.bias", W);
  t->merger_fc1_ = l.linear(p + "merger.mlp.0", M, M, true);
  t->merger_fc2_ = l.linear(p + "merger.mlp.2", c.out_width, M, true);
  // Qwen2VLVisionRotaryEmbedding: inv_freq = 1 / theta^(arange(0, d, 2) / d), d = head_dim / 2,
  // in float32; the cos/sin rows are [h freqs | w freqs], repeated for rotate_half.
  const int64_t spatial = c.head_dim / 2, quarter = spatial / 2;
  std::vector<float> inv(static_cast<size_t>(spatial));
  std::vector<int32_t> axes(static_cast<size_t>(spatial));
  for (int64_t i = 0; i < quarter; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(spatial);
    const auto f = static_cast<float>(
        std::pow(static_cast<double>(static_cast<float>(c.rope_theta)), static_cast<double>(e)));
    inv[static_cast<size_t>(i)] = inv[static_cast<size_t>(quarter + i)] = 1.0f / f;
    axes[static_cast<size_t>(i)] = 1;
    axes[static_cast<size_t>(quarter + i)] = 2;
  }
  t->inv_freq_ = DeviceFloats(l.backend(), inv);
  t->axes_ = DeviceArray<int32_t>(l.backend(), axes);
  return t;
}

void VisionTower::record(Graph& g, Tensor pixels, Tensor out) const {
  const VisionConfig& c = config_;
  const int64_t W = c.width, D = c.head_dim, H = c.n_heads;
  const Tensor h = g.buffer("h", W);
  g.add(node::Linear{.x = pixels, .w = &patch_embed_, .y = h});
  {
    const Graph::Scope scope(g, "rotary");
    const Tensor cos = g.buffer("cos", D / 2, RowSpace::kRows, BufferKind::kPackedF32);
    const Tensor sin = g.buffer("sin", D / 2, RowSpace::kRows, BufferKind::kPackedF32);
    g.add(node::RopeRows{.cos = cos,
                         .sin = sin,
                         .inv_freq = inv_freq_.data(),
                         .axes = axes_.data(),
                         .half = D / 2,
                         .scaling = 1.0f});
    g.set_rope_rows(cos, sin);
  }
  const auto scale = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    const Graph::Scope scope(g, "blocks." + std::to_string(i));
    const Tensor x = g.buffer("x", W);
    const Tensor qkv = g.buffer("qkv", 3 * W);
    const Tensor attn = g.buffer("attn", W);
    const Tensor delta = g.buffer("delta", W);
    g.add(node::LayerNorm{.x = h,
                          .out = x,
                          .weight = b.norm1_w.data(),
                          .bias = b.norm1_b.data(),
                          .eps = kLayerNormEps});
    g.add(node::Linear{.x = x, .w = &b.qkv, .y = qkv});
    const Tensor q = qkv.cols(0, W), k = qkv.cols(W, W), v = qkv.cols(2 * W, W);
    g.add(node::Rope{.x = q, .n_heads = H, .head_dim = D});
    g.add(node::Rope{.x = k, .n_heads = H, .head_dim = D});
    g.add(node::VarlenAttention{
        .q = q, .k = k, .v = v, .out = attn, .n_heads = H, .head_dim = D, .scale = scale});
    g.add(node::Linear{.x = attn, .w = &b.proj, .y = delta});
    g.add(node::Add{.x = delta, .y = h});
    const Tensor mlp = g.buffer("mlp", c.mlp_width);
    g.add(node::LayerNorm{.x = h,
                          .out = x,
                          .weight = b.norm2_w.data(),
                          .bias = b.norm2_b.data(),
                          .eps = kLayerNormEps});
    g.add(node::Linear{.x = x, .w = &b.fc1, .y = mlp});
    g.add(node::Activate{.x = mlp, .out = mlp, .act = act_});
    g.add(node::Linear{.x = mlp, .w = &b.fc2, .y = delta});
    g.add(node::Add{.x = delta, .y = h});
  }
  const Graph::Scope scope(g, "merger");
  const int64_t M = c.merge_rows() * W;
  const Tensor x = g.buffer("x", W);
  const Tensor merged = g.buffer("merged", M, RowSpace::kMerged);
  const Tensor hidden = g.buffer("hidden", M, RowSpace::kMerged);
  g.add(node::LayerNorm{
      .x = h, .out = x, .weight = ln_q_w_.data(), .bias = ln_q_b_.data(), .eps = kLayerNormEps});
  g.add(node::MergeRows{.x = x, .out = merged});
  g.add(node::Linear{.x = merged, .w = &merger_fc1_, .y = hidden});
  g.add(node::Activate{.x = hidden, .out = hidden, .act = Activation::kGelu});  // nn.GELU()
  g.add(node::Linear{.x = hidden, .w = &merger_fc2_, .y = out});
}

}  // namespace metrale
