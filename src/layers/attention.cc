#include "layers/attention.h"

#include <sstream>

#include "core/error.h"

namespace metrale {

std::unique_ptr<GqaAttention> GqaAttention::load(const ModelConfig& c, int64_t layer,
                                                 TensorLoader& l, const std::string& p) {
  const LayerKind kind = c.layer_kind(layer);
  METRALE_CHECK(kind == LayerKind::kSlidingAttention || kind == LayerKind::kFullAttention, c.source,
                ": layer ", layer, " is ", layer_kind_name(kind),
                ", not a softmax attention layer");
  METRALE_CHECK(kind != LayerKind::kSlidingAttention || c.sliding_window.has_value(), c.source,
                ": layer ", layer, " uses sliding attention but sliding_window is not set");
  return load(c, kind, l, p);
}

std::unique_ptr<GqaAttention> GqaAttention::load(const ModelConfig& c, LayerKind kind,
                                                 TensorLoader& l, const std::string& p) {
  METRALE_CHECK(kind == LayerKind::kFullAttention ||
                    (kind == LayerKind::kSlidingAttention && c.sliding_window.has_value()),
                c.source, ": ", p, ": ", layer_kind_name(kind),
                " is not a softmax attention layer kind this config supports");
  auto a = std::make_unique<GqaAttention>();
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t Q = c.n_heads * D, KV = c.n_kv_heads * D;
  if (c.attention_output_gate) {
    METRALE_CHECK(!c.attention_qkv_bias, c.source, ": attention_bias with a gated q_proj (",
                  c.model_type, ") is not supported");
    // One gather part per tensor (each is claimed once): q_proj's query rows of every head,
    // then its gate rows; k_proj and v_proj as they are.
    TensorLoader::RowGather qg{p + "q_proj.weight", 2 * Q, {}};
    for (const int64_t half : {int64_t{0}, D}) {
      for (int64_t h = 0; h < c.n_heads; ++h)
        for (int64_t d = 0; d < D; ++d) qg.rows.push_back(2 * h * D + half + d);
    }
    auto identity = [](const std::string& name, int64_t n) {
      TensorLoader::RowGather g{name, n, {}};
      for (int64_t r = 0; r < n; ++r) g.rows.push_back(r);
      return g;
    };
    a->qkv_ = Linear::fused(l.gathered_matrix({qg, identity(p + "k_proj.weight", KV),
                                               identity(p + "v_proj.weight", KV)},
                                              H, p + "q_proj(query|gate)+k_proj+v_proj"),
                            {{p + "q_proj (query rows)", 0, Q},
                             {p + "q_proj (gate rows)", Q, Q},
                             {p + "k_proj", 2 * Q, KV},
                             {p + "v_proj", 2 * Q + KV, KV}});
    a->output_gate_ = true;
  } else {
    a->qkv_ = load_linear(l, {p + "q_proj", p + "k_proj", p + "v_proj"}, {Q, KV, KV}, H,
                          c.attention_qkv_bias);
  }
  a->o_ = load_linear(l, p + "o_proj", H, Q, c.attention_out_bias);
  if (c.qk_norm) {
    a->q_norm_ = load_norm(l, c, p + "q_norm.weight", D);
    a->k_norm_ = load_norm(l, c, p + "k_norm.weight", D);
  }
  a->pairs_ = c.rope.pairs_interleaved;
  a->shape_ = AttentionShape{.n_heads = c.n_heads,
                             .n_kv_heads = c.n_kv_heads,
                             .head_dim = D,
                             .scale = static_cast<float>(c.attention_scale)};
  if (kind == LayerKind::kSlidingAttention) a->shape_.sliding_window = *c.sliding_window;
  return a;
}

void GqaAttention::record(Graph& g, const BlockIo& io) const {
  const int64_t D = shape_.head_dim;
  const int64_t Q = shape_.n_heads * D, KV = shape_.n_kv_heads * D;
  const Tensor qkv = g.buffer("qkv", qkv_.n_out());
  const Tensor attn = g.buffer("attn", Q);
  const int64_t kv_col = output_gate_ ? 2 * Q : Q;  // gated: q | gate | k | v
  const Tensor q = qkv.cols(0, Q), k = qkv.cols(kv_col, KV), v = qkv.cols(kv_col + KV, KV);
  qkv_.record(g, io.x, qkv);
  if (!q_norm_.empty()) {  // qwen3: per-head RMSNorm of q and k before rope
    q_norm_.record(g, q, q, D);
    k_norm_.record(g, k, k, D);
  }
  g.add(node::Rope{.x = q, .n_heads = shape_.n_heads, .head_dim = D, .pairs = pairs_});
  g.add(node::Rope{.x = k, .n_heads = shape_.n_kv_heads, .head_dim = D, .pairs = pairs_});
  g.add(node::KvStore{.k = k, .v = v, .layer = io.layer});
  g.add(node::Attention{.q = q, .out = attn, .layer = io.layer, .shape = shape_});
  if (output_gate_) g.add(node::SigmoidMul{.gate = qkv.cols(Q, Q), .y = attn});
  o_.record(g, attn, io.out);
}

std::string GqaAttention::describe() const {
  std::ostringstream os;
  os << "attention " << shape_.n_heads << " heads / " << shape_.n_kv_heads << " kv x "
     << shape_.head_dim;
  if (!q_norm_.empty()) os << ", qk-norm";
  if (shape_.sliding_window > 0) os << ", window " << shape_.sliding_window;
  if (output_gate_) os << ", gated output";
  if (pairs_) os << ", rope on adjacent pairs";
  if (qkv_.is_fused()) os << ", fused qkv";
  return os.str();
}

uint64_t GqaAttention::active_bytes_per_token() const { return qkv_.bytes() + o_.bytes(); }

}  // namespace metrale
