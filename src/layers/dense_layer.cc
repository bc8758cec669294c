#include "layers/dense_layer.h"

#include <cmath>

#include "core/error.h"

namespace metrale {
namespace {

// Order of the scratch rows inside the block; widths come from the config.
struct ScratchWidths {
  int64_t h, q, kv, i;
};
ScratchWidths widths(const ModelConfig& c) {
  return {c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.intermediate_size};
}
// Each block starts 64-byte aligned (16 floats).
int64_t padded(int64_t n) { return (n + 15) / 16 * 16; }

Activation activation_for(const ModelConfig& c) {
  if (c.hidden_act == "silu" || c.hidden_act == "swish") return Activation::kSilu;
  if (c.hidden_act == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  throw make_error(c.source, ": hidden_act '", c.hidden_act,
                   "' is not supported (expected silu or gelu_pytorch_tanh)");
}

}  // namespace

DenseScratch DenseScratch::first(int64_t n) const {
  auto cut = [n](Rows r) { return Rows{r.data, n, r.n_cols, r.stride}; };
  return {cut(x), cut(qkv), cut(q), cut(k), cut(v), cut(attn), cut(gate_up), cut(gate), cut(up)};
}

size_t dense_scratch_bytes(const ModelConfig& c, int64_t max_rows) {
  const ScratchWidths w = widths(c);
  const int64_t per_row = padded(w.h) + padded(w.q + 2 * w.kv) + padded(w.q) + padded(2 * w.i);
  return static_cast<size_t>(per_row * max_rows) * sizeof(float);
}

DenseScratch dense_scratch_at(void* base, const ModelConfig& c, int64_t max_rows) {
  const ScratchWidths w = widths(c);
  float* p = static_cast<float*>(base);
  auto take = [&](int64_t cols) {
    Rows r{p, max_rows, cols, padded(cols)};
    p += padded(cols) * max_rows;
    return r;
  };
  DenseScratch s;
  s.x = take(w.h);
  s.qkv = take(w.q + 2 * w.kv);
  s.q = column_slice(s.qkv, 0, w.q);
  s.k = column_slice(s.qkv, w.q, w.kv);
  s.v = column_slice(s.qkv, w.q + w.kv, w.kv);
  s.attn = take(w.q);
  s.gate_up = take(2 * w.i);
  s.gate = column_slice(s.gate_up, 0, w.i);
  s.up = column_slice(s.gate_up, w.i, w.i);
  return s;
}

DenseLayer::DenseLayer(const ModelConfig& c, const DenseLayerWeights& weights, int64_t index)
    : w_(&weights),
      n_heads_(c.n_heads),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim),
      eps_(static_cast<float>(c.rms_norm_eps)),
      norm_style_(ships_vanilla_norm_weights(c) ? NormStyle::kWeight : NormStyle::kOnePlusWeight),
      act_(activation_for(c)) {
  shape_ = AttentionShape{.n_heads = c.n_heads,
                          .n_kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim,
                          .scale = static_cast<float>(c.attention_scale)};
  if (c.layer_kind(index) == LayerKind::kSlidingAttention) {
    METRALE_CHECK(c.sliding_window.has_value(), c.source, ": layer ", index,
                  " uses sliding attention but sliding_window is not set");
    shape_.sliding_window = *c.sliding_window;
  } else {
    METRALE_CHECK(c.layer_kind(index) == LayerKind::kFullAttention, c.source, ": layer ", index,
                  " is ", layer_kind_name(c.layer_kind(index)), ", not a dense attention layer");
  }
}

void DenseLayer::forward(const ForwardContext& ctx, const LayerState& state, Residual& r,
                         const DenseScratch& scratch) const {
  Backend& be = *ctx.backend;
  const DenseScratch s = scratch.first(ctx.n_rows);
  const DenseLayerWeights& w = *w_;

  // --- attention block ---
  add_and_norm(be, r, s.x, w.input_norm.data(), eps_, norm_style_);
  if (w.qkv.data != nullptr) {
    be.linear(s.x, w.qkv, s.qkv);
  } else {
    be.linear(s.x, w.q, s.q);
    be.linear(s.x, w.k, s.k);
    be.linear(s.x, w.v, s.v);
  }
  if (!w.q_norm.empty()) {  // qwen3: per-head RMSNorm of q and k before rope
    be.rms_norm({.x = s.q, .out = s.q, .weight = w.q_norm.data(), .eps = eps_,
                 .style = norm_style_, .group = head_dim_});
    be.rms_norm({.x = s.k, .out = s.k, .weight = w.k_norm.data(), .eps = eps_,
                 .style = norm_style_, .group = head_dim_});
  }
  be.rope({.x = s.q, .n_heads = n_heads_, .head_dim = head_dim_, .positions = ctx.positions,
           .table = ctx.rope});
  be.rope({.x = s.k, .n_heads = n_kv_heads_, .head_dim = head_dim_, .positions = ctx.positions,
           .table = ctx.rope});
  be.kv_store({.k = s.k, .v = s.v, .slots = ctx.slots, .cache = state.kv});
  if (ctx.prefill) {
    be.attention_prefill(
        {.q = s.q, .out = s.attn, .cache = state.kv, .seq = ctx.seqs[0], .shape = shape_});
  } else {
    be.attention_decode(
        {.q = s.q, .out = s.attn, .cache = state.kv, .seqs = ctx.seqs, .shape = shape_});
  }
  Rows delta{r.delta.data, ctx.n_rows, r.delta.n_cols, r.delta.stride};
  be.linear(s.attn, w.o, delta);
  r.pending = true;

  // --- MLP block ---
  add_and_norm(be, r, s.x, w.post_attn_norm.data(), eps_, norm_style_);
  if (w.gate_up.data != nullptr) {
    be.linear(s.x, w.gate_up, s.gate_up);
  } else {
    be.linear(s.x, w.gate, s.gate);
    be.linear(s.x, w.up, s.up);
  }
  be.gated_activation({.gate = s.gate, .up = s.up, .out = s.gate, .act = act_});
  be.linear(s.gate, w.down, delta);
  r.pending = true;
}

}  // namespace metrale
