#include "layers/attention.h"

#include <sstream>

#include "core/error.h"

namespace metrale {

std::unique_ptr<GqaAttention> GqaAttention::load(const ModelConfig& c, int64_t layer,
                                                 TensorLoader& l, const std::string& p) {
  auto a = std::make_unique<GqaAttention>();
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t Q = c.n_heads * D, KV = c.n_kv_heads * D;
  a->qkv_ = load_linear(l, {p + "q_proj", p + "k_proj", p + "v_proj"}, {Q, KV, KV}, H,
                        c.attention_qkv_bias);
  a->o_ = load_linear(l, p + "o_proj", H, Q, c.attention_out_bias);
  if (c.qk_norm) {
    a->q_norm_ = load_norm(l, c, p + "q_norm.weight", D);
    a->k_norm_ = load_norm(l, c, p + "k_norm.weight", D);
  }
  a->shape_ = AttentionShape{.n_heads = c.n_heads,
                             .n_kv_heads = c.n_kv_heads,
                             .head_dim = D,
                             .scale = static_cast<float>(c.attention_scale)};
  if (c.layer_kind(layer) == LayerKind::kSlidingAttention) {
    METRALE_CHECK(c.sliding_window.has_value(), c.source, ": layer ", layer,
                  " uses sliding attention but sliding_window is not set");
    a->shape_.sliding_window = *c.sliding_window;
  } else {
    METRALE_CHECK(c.layer_kind(layer) == LayerKind::kFullAttention, c.source, ": layer ", layer,
                  " is ", layer_kind_name(c.layer_kind(layer)), ", not a softmax attention layer");
  }
  return a;
}

size_t GqaAttention::workspace_floats(int64_t max_rows) const {
  const int64_t q = shape_.n_heads * shape_.head_dim;
  return rows_floats(max_rows, qkv_.n_out()) + rows_floats(max_rows, q);
}

void GqaAttention::forward(const ForwardContext& ctx, const LayerState& state, ConstRows x,
                           Rows out, Workspace ws) const {
  Backend& be = *ctx.backend;
  const int64_t n = ctx.n_rows, D = shape_.head_dim;
  const int64_t Q = shape_.n_heads * D, KV = shape_.n_kv_heads * D;
  const Rows qkv = ws.rows(n, qkv_.n_out());
  const Rows attn = ws.rows(n, Q);
  const Rows q = column_slice(qkv, 0, Q), k = column_slice(qkv, Q, KV),
             v = column_slice(qkv, Q + KV, KV);
  qkv_.forward(be, x, qkv);
  if (!q_norm_.empty()) {  // qwen3: per-head RMSNorm of q and k before rope
    q_norm_.apply(be, q, q, D);
    k_norm_.apply(be, k, k, D);
  }
  be.rope({.x = q,
           .n_heads = shape_.n_heads,
           .head_dim = D,
           .positions = ctx.positions,
           .table = ctx.rope});
  be.rope({.x = k,
           .n_heads = shape_.n_kv_heads,
           .head_dim = D,
           .positions = ctx.positions,
           .table = ctx.rope});
  be.kv_store({.k = k, .v = v, .slots = ctx.slots, .cache = state.kv});
  be.attention({.q = q,
                .out = attn,
                .cache = state.kv,
                .seqs = ctx.seqs,
                .row_seq = ctx.row_seq,
                .positions = ctx.positions,
                .shape = shape_});
  o_.forward(be, attn, out);
}

std::string GqaAttention::describe() const {
  std::ostringstream os;
  os << "attention " << shape_.n_heads << " heads / " << shape_.n_kv_heads << " kv x "
     << shape_.head_dim;
  if (!q_norm_.empty()) os << ", qk-norm";
  if (shape_.sliding_window > 0) os << ", window " << shape_.sliding_window;
  if (qkv_.is_fused()) os << ", fused qkv";
  return os.str();
}

uint64_t GqaAttention::active_bytes_per_token() const { return qkv_.bytes() + o_.bytes(); }

}  // namespace metrale
