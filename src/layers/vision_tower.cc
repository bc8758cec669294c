#include "layers/vision_tower.h"

#include <algorithm>
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

// One axis of transformers' _interpolation_axis_taps_weights (bilinear, align_corners, border
// padding), in its f32 arithmetic: src = i (side - 1) / max(size - 1, 1), taps floor(src) and
// floor(src) + 1 clamped into the table, weights max(1 - |src - floor - offset|, 0).
void axis_taps(int64_t i, int64_t size, int64_t side, std::array<int32_t, 2>& taps,
               std::array<float, 2>& weights) {
  const float src = static_cast<float>(i) * static_cast<float>(side - 1) /
                    static_cast<float>(std::max<int64_t>(size - 1, 1));
  const float fl = std::floor(src);
  for (int o = 0; o < 2; ++o) {
    const auto raw = static_cast<int64_t>(fl) + o;
    taps[static_cast<size_t>(o)] = static_cast<int32_t>(std::clamp<int64_t>(raw, 0, side - 1));
    const float d = std::fabs(src - fl - static_cast<float>(o));
    weights[static_cast<size_t>(o)] = std::max(1.0f - d, 0.0f);
  }
}

// The learned position table's taps for every row, in the rows' (merge-block) order: the 2 x 2
// outer product of the h and w axes' taps, h major.
void interpolation_taps(std::span<const std::array<int64_t, 3>> grids, int64_t side,
                        VisionPassLayout& p) {
  p.pos_taps.reserve(static_cast<size_t>(p.n_rows * 4));
  p.pos_weights.reserve(static_cast<size_t>(p.n_rows * 4));
  for (size_t k = 0; k < grids.size(); ++k) {
    const int64_t t = grids[k][0], h = grids[k][1], w = grids[k][2];
    const auto start = static_cast<size_t>(p.pos_taps.size() / 4);
    for (int64_t r = 0; r < t * h * w; ++r) {
      // positions3 holds each row's (0, h, w) already in this order.
      const size_t row = start + static_cast<size_t>(r);
      std::array<int32_t, 2> ht{}, wt{};
      std::array<float, 2> hw{}, ww{};
      axis_taps(p.positions3[row * 3 + 1], h, side, ht, hw);
      axis_taps(p.positions3[row * 3 + 2], w, side, wt, ww);
      for (size_t a = 0; a < 2; ++a)
        for (size_t b = 0; b < 2; ++b) {
          p.pos_taps.push_back(static_cast<int32_t>(ht[a] * side + wt[b]));
          p.pos_weights.push_back(hw[a] * ww[b]);
        }
    }
  }
}

// GLM-4V's Glm4vVisionEmbeddings: F.grid_sample(table, grid, bicubic, align_corners=False,
// border) at each patch's normalised centre ((i + 0.5) / size) * 2 - 1, unnormalised to
// (g + 1) * side / 2 - 0.5 in the table's pixels; taps floor - 1 .. floor + 2 clamped into the
// table (border padding clamps each tap), the 4 x 4 outer product of the axes' weights, h major.
void bicubic_axis(int64_t i, int64_t size, int64_t side, std::array<int32_t, 4>& taps,
                  std::array<float, 4>& weights) {
  const float g = ((static_cast<float>(i) + 0.5f) / static_cast<float>(size)) * 2.0f - 1.0f;
  const float x = (g + 1.0f) * (static_cast<float>(side) / 2.0f) - 0.5f;
  const float fl = std::floor(x);
  weights = bicubic_weights(x - fl);
  for (int o = 0; o < 4; ++o) {
    const auto raw = static_cast<int64_t>(fl) - 1 + o;
    taps[static_cast<size_t>(o)] = static_cast<int32_t>(std::clamp<int64_t>(raw, 0, side - 1));
  }
}

void bicubic_taps(std::span<const std::array<int64_t, 3>> grids, int64_t side,
                  VisionPassLayout& p) {
  p.pos_taps.reserve(static_cast<size_t>(p.n_rows * 16));
  p.pos_weights.reserve(static_cast<size_t>(p.n_rows * 16));
  size_t row = 0;
  for (const auto& [t, h, w] : grids) {
    for (int64_t r = 0; r < t * h * w; ++r, ++row) {
      std::array<int32_t, 4> ht{}, wt{};
      std::array<float, 4> hw{}, ww{};
      bicubic_axis(p.positions3[row * 3 + 1], h, side, ht, hw);
      bicubic_axis(p.positions3[row * 3 + 2], w, side, wt, ww);
      for (size_t a = 0; a < 4; ++a)
        for (size_t b = 0; b < 4; ++b) {
          p.pos_taps.push_back(static_cast<int32_t>(ht[a] * side + wt[b]));
          p.pos_weights.push_back(hw[a] * ww[b]);
        }
    }
  }
}

}  // namespace

std::array<float, 4> bicubic_weights(float t) {
  // aten's get_cubic_upsample_coefficients: cubic_convolution2 for the outer taps (distance
  // t + 1 and 2 - t), cubic_convolution1 for the inner ones (t and 1 - t).
  constexpr float A = -0.75f;
  auto inner = [](float x) { return ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f; };
  auto outer = [](float x) { return ((A * x - 5.0f * A) * x + 8.0f * A) * x - 4.0f * A; };
  return {outer(t + 1.0f), inner(t), inner(1.0f - t), outer(2.0f - t)};
}

VisionPassLayout vision_pass_layout(std::span<const std::array<int64_t, 3>> grids, int64_t merge,
                                    int64_t window, int64_t pos_side, bool bicubic) {
  METRALE_CHECK(merge >= 1 && window >= 0 && pos_side >= 0, "vision pass: merge size ", merge,
                ", window ", window, ", position table side ", pos_side);
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
  const int64_t unit = merge * merge;
  p.n_merged = p.n_rows / unit;
  p.row_index.resize(static_cast<size_t>(p.n_rows));
  for (int64_t r = 0; r < p.n_rows; ++r)
    p.row_index[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  if (pos_side > 0 && bicubic) bicubic_taps(grids, pos_side, p);
  if (pos_side > 0 && !bicubic) interpolation_taps(grids, pos_side, p);
  if (window == 0) return p;
  // get_vision_window_index: per item and temporal patch, the merged grid padded up to whole
  // windows (a full window more when it divides, as transformers pads), windows in row-major
  // order, merged patches row-major inside; empty windows dropped (unique_consecutive).
  std::vector<int32_t> order;  // window-ordered merged patch -> its merged index
  order.reserve(static_cast<size_t>(p.n_merged));
  p.cu_window_seqlens.push_back(0);
  int64_t base = 0;
  for (const auto& [t, h, w] : grids) {
    const int64_t lh = h / merge, lw = w / merge;
    const int64_t nwh = (lh + window - lh % window) / window;
    const int64_t nww = (lw + window - lw % window) / window;
    for (int64_t f = 0; f < t; ++f)
      for (int64_t wy = 0; wy < nwh; ++wy)
        for (int64_t wx = 0; wx < nww; ++wx) {
          int64_t count = 0;
          for (int64_t y = wy * window; y < std::min(lh, (wy + 1) * window); ++y)
            for (int64_t x = wx * window; x < std::min(lw, (wx + 1) * window); ++x, ++count)
              order.push_back(static_cast<int32_t>(base + f * lh * lw + y * lw + x));
          if (count > 0)
            p.cu_window_seqlens.push_back(p.cu_window_seqlens.back() +
                                          static_cast<int32_t>(count * unit));
        }
    base += t * lh * lw;
  }
  p.merged_inverse.resize(order.size());
  p.window_rows.resize(static_cast<size_t>(p.n_rows));
  std::vector<int32_t> positions(p.positions3.size());
  for (size_t k = 0; k < order.size(); ++k) {
    p.merged_inverse[static_cast<size_t>(order[k])] = static_cast<int32_t>(k);
    for (int64_t j = 0; j < unit; ++j) {
      const int64_t row = static_cast<int64_t>(k) * unit + j;
      const int64_t src = int64_t{order[k]} * unit + j;
      p.window_rows[static_cast<size_t>(row)] = static_cast<int32_t>(src);
      std::copy_n(p.positions3.begin() + src * 3, 3, positions.begin() + row * 3);
    }
  }
  p.positions3 = std::move(positions);
  return p;
}

int64_t VisionTower::window() const {
  if (config_.tower != VisionTowerKind::kQwen2_5Vl) return 0;
  return config_.window_size / config_.spatial_merge_size / config_.patch_size;
}

int64_t VisionTower::pos_side() const {
  if (config_.num_position_embeddings == 0) return 0;
  int64_t side = 1;
  while (side * side < config_.num_position_embeddings) ++side;
  return side;  // the config's parser checked the square
}

void VisionTower::norm(Graph& g, Tensor x, Tensor out, const DeviceFloats& w,
                       const DeviceFloats& b) const {
  if (config_.tower == VisionTowerKind::kQwen2_5Vl || config_.tower == VisionTowerKind::kGlm4v) {
    // Qwen2RMSNorm(eps=1e-6), Glm4vRMSNorm(rms_norm_eps)
    g.add(node::RmsNorm{
        .x = x, .out = out, .weight = w.data(), .eps = static_cast<float>(config_.norm_eps)});
  } else {
    g.add(node::LayerNorm{
        .x = x, .out = out, .weight = w.data(), .bias = b.data(), .eps = kLayerNormEps});
  }
}

std::unique_ptr<VisionTower> VisionTower::load(const VisionConfig& c, TensorLoader& l,
                                               const std::string& p) {
  const bool glm = c.tower == VisionTowerKind::kGlm4v;
  const bool rms = c.tower == VisionTowerKind::kQwen2_5Vl || glm;
  const bool qwen3 = c.tower == VisionTowerKind::kQwen3Vl || c.tower == VisionTowerKind::kQwen3_5;
  auto t = std::unique_ptr<VisionTower>(new VisionTower());
  t->config_ = c;
  t->act_ = activation_of(c);
  const int64_t W = c.width;
  // Conv3d [width, C, T, P, P], kernel = stride: a linear over the flattened (C, T, P, P) patch.
  const std::string embed = p + "patch_embed.proj.weight";
  const std::vector<float> conv =
      l.floats(embed, {W, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size});
  t->patch_embed_ = l.derived_matrix(embed, W, c.patch_dim(), conv);
  if (qwen3 || glm) {
    t->patch_bias_ = l.norm(p + "patch_embed.proj.bias", W);
    t->patch_embed_.bias = t->patch_bias_.data();
    t->patch_embed_.bias_dtype = DType::kF32;
    t->pos_embed_ =
        l.device_floats(p + (glm ? "embeddings.position_embedding.weight" : "pos_embed.weight"),
                        {c.num_position_embeddings, W});
  }
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string b = p + "blocks." + std::to_string(i) + ".";
    Block blk;
    blk.norm1_w = l.norm(b + "norm1.weight", W);
    blk.norm2_w = l.norm(b + "norm2.weight", W);
    if (!rms) {
      blk.norm1_b = l.norm(b + "norm1.bias", W);
      blk.norm2_b = l.norm(b + "norm2.bias", W);
    }
    blk.qkv = l.linear(b + "attn.qkv", 3 * W, W, c.qkv_bias);
    blk.proj = l.linear(b + "attn.proj", W, W, !glm);
    if (rms) {  // GLM-4V's Glm4VisionMlp has no biases
      blk.fc1 = l.linear(b + "mlp.gate_proj", c.mlp_width, W, !glm);
      blk.up = l.linear(b + "mlp.up_proj", c.mlp_width, W, !glm);
      blk.fc2 = l.linear(b + "mlp.down_proj", W, c.mlp_width, !glm);
      blk.full_attention = std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(),
                                     i) != c.fullatt_block_indexes.end();
    } else if (qwen3) {
      blk.fc1 = l.linear(b + "mlp.linear_fc1", c.mlp_width, W, true);
      blk.fc2 = l.linear(b + "mlp.linear_fc2", W, c.mlp_width, true);
    } else {
      blk.fc1 = l.linear(b + "mlp.fc1", c.mlp_width, W, true);
      blk.fc2 = l.linear(b + "mlp.fc2", W, c.mlp_width, true);
    }
    t->blocks_.push_back(std::move(blk));
  }
  const int64_t M = c.merge_rows() * W;
  auto merger = [&](const std::string& m, bool post_shuffle) {
    Merger g;
    g.post_shuffle = post_shuffle;
    const int64_t n = post_shuffle ? M : W;
    g.norm_w = l.norm(m + (qwen3 ? "norm.weight" : "ln_q.weight"), n);
    if (!rms) g.norm_b = l.norm(m + (qwen3 ? "norm.bias" : "ln_q.bias"), n);
    g.fc1 = l.linear(m + (qwen3 ? "linear_fc1" : "mlp.0"), M, M, true);
    g.fc2 = l.linear(m + (qwen3 ? "linear_fc2" : "mlp.2"), c.out_width, M, true);
    return g;
  };
  if (glm) {
    t->load_glm_head(l, p);
  } else {
    t->merger_ = merger(p + "merger.", false);
  }
  for (size_t j = 0; j < c.deepstack_visual_indexes.size(); ++j) {
    t->deepstack_.emplace_back(
        c.deepstack_visual_indexes[j],
        merger(p + "deepstack_merger_list." + std::to_string(j) + ".", true));
  }
  // Qwen2VLVisionRotaryEmbedding: inv_freq = 1 / theta^(arange(0, d, 2) / d), d = head_dim / 2,
  // in float32; the cos/sin rows are [h freqs | w freqs], repeated for rotate_half (Qwen3-VL's
  // axial rope is the same table).
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
  const bool windows = window() > 0;
  if (windows) {  // the pixel rows in window order (the patch embedding is row by row)
    const Tensor ordered = g.buffer("pixels_windowed", c.patch_dim());
    g.add(node::GatherRows{.x = pixels, .out = ordered, .list = node::RowList::kWindowRows});
    g.add(node::Linear{.x = ordered, .w = &patch_embed_, .y = h});
  } else {
    g.add(node::Linear{.x = pixels, .w = &patch_embed_, .y = h});
  }
  // GLM-4V: post_conv_layernorm before the positions are added.
  if (!glm_.post_conv_norm.empty()) norm(g, h, h, glm_.post_conv_norm, glm_.post_conv_norm);
  if (pos_embed_.data() != nullptr) {  // + the learned positions, interpolated to the grid
    g.add(node::TapSum{.out = h,
                       .table = pos_embed_.data(),
                       .table_rows = c.num_position_embeddings,
                       .n_taps = pos_bicubic() ? 16 : 4});
  }
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
    norm(g, h, x, b.norm1_w, b.norm1_b);
    g.add(node::Linear{.x = x, .w = &b.qkv, .y = qkv});
    const Tensor q = qkv.cols(0, W), k = qkv.cols(W, W), v = qkv.cols(2 * W, W);
    g.add(node::Rope{.x = q, .n_heads = H, .head_dim = D});
    g.add(node::Rope{.x = k, .n_heads = H, .head_dim = D});
    g.add(node::VarlenAttention{.q = q,
                                .k = k,
                                .v = v,
                                .out = attn,
                                .n_heads = H,
                                .head_dim = D,
                                .scale = scale,
                                .windows = windows && !b.full_attention});
    g.add(node::Linear{.x = attn, .w = &b.proj, .y = delta});
    g.add(node::Add{.x = delta, .y = h});
    const Tensor mlp = g.buffer("mlp", c.mlp_width);
    norm(g, h, x, b.norm2_w, b.norm2_b);
    g.add(node::Linear{.x = x, .w = &b.fc1, .y = mlp});
    if (b.up.data != nullptr) {  // SwiGLU: act(gate) * up
      const Tensor up = g.buffer("up", c.mlp_width);
      g.add(node::Linear{.x = x, .w = &b.up, .y = up});
      g.add(node::GatedActivation{.gate = mlp, .up = up, .out = mlp, .act = act_});
    } else {
      g.add(node::Activate{.x = mlp, .out = mlp, .act = act_});
    }
    g.add(node::Linear{.x = mlp, .w = &b.fc2, .y = delta});
    g.add(node::Add{.x = delta, .y = h});
    for (size_t j = 0; j < deepstack_.size(); ++j) {
      if (deepstack_[j].first != static_cast<int64_t>(i)) continue;
      const Graph::Scope ds(g, "deepstack_merger_list." + std::to_string(j));
      record_merger(g, deepstack_[j].second, h,
                    out.cols(c.out_width * static_cast<int64_t>(j + 1), c.out_width), windows);
    }
  }
  if (c.tower == VisionTowerKind::kGlm4v) {
    record_glm_head(g, h, out);
    return;
  }
  const Graph::Scope scope(g, "merger");
  record_merger(g, merger_, h, out.cols(0, c.out_width), windows);
}

void VisionTower::record_merger(Graph& g, const Merger& m, Tensor h, Tensor out,
                                bool windows) const {
  const VisionConfig& c = config_;
  const int64_t W = c.width, M = c.merge_rows() * W;
  const Tensor merged = g.buffer("merged", M, RowSpace::kMerged);
  const Tensor hidden = g.buffer("hidden", M, RowSpace::kMerged);
  if (m.post_shuffle) {  // the merge, then the norm over merge^2 width
    g.add(node::MergeRows{.x = h, .out = merged});
    norm(g, merged, merged, m.norm_w, m.norm_b);
  } else {
    const Tensor x = g.buffer("x", W);
    norm(g, h, x, m.norm_w, m.norm_b);
    g.add(node::MergeRows{.x = x, .out = merged});
  }
  g.add(node::Linear{.x = merged, .w = &m.fc1, .y = hidden});
  g.add(node::Activate{.x = hidden, .out = hidden, .act = Activation::kGelu});  // nn.GELU()
  if (windows) {  // back to the original order
    const Tensor ordered = g.buffer("out_windowed", c.out_width, RowSpace::kMerged);
    g.add(node::Linear{.x = hidden, .w = &m.fc2, .y = ordered});
    g.add(node::GatherRows{.x = ordered, .out = out, .list = node::RowList::kMergedInverse});
  } else {
    g.add(node::Linear{.x = hidden, .w = &m.fc2, .y = out});
  }
}

}  // namespace metrale
