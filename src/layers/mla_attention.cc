#include "layers/mla_attention.h"

#include <algorithm>
#include <span>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"

namespace metrale {
namespace {

// One head's product per call of `call(h)`, every head in one Backend::linears node.
template <typename Call>
void per_head(Graph& g, const std::vector<WeightTensor>& heads, Call&& call) {
  node::Linears n;
  for (size_t h = 0; h < heads.size(); ++h) n.calls.push_back(call(static_cast<int64_t>(h)));
  g.add(std::move(n));
}

}  // namespace

std::unique_ptr<MlaAttention> MlaAttention::load(const ModelConfig& c, TensorLoader& l,
                                                 const std::string& p) {
  const MlaConfig& m = c.mla;
  METRALE_CHECK(c.is_mla() && m.qk_nope_head_dim > 0 && m.qk_rope_head_dim > 0 && m.v_head_dim > 0,
                c.source,
                ": multi-head latent attention needs kv_lora_rank, qk_nope_head_dim, "
                "qk_rope_head_dim and v_head_dim > 0");
  METRALE_CHECK(c.rope.rotary_dim == m.qk_rope_head_dim, c.source, ": the rope rotates ",
                c.rope.rotary_dim, " values, expected qk_rope_head_dim ", m.qk_rope_head_dim);
  auto a = std::make_unique<MlaAttention>();
  const int64_t H = c.hidden_size, N = c.n_heads, R = m.kv_lora_rank;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, V = m.v_head_dim;
  a->n_heads_ = N;
  a->kv_rank_ = R;
  a->nope_dim_ = nope;
  a->rope_dim_ = rope;
  a->v_dim_ = V;
  a->scale_ = static_cast<float>(c.attention_scale);
  a->pairs_ = c.rope.pairs_interleaved;
  // DeepseekV3RMSNorm(q_lora_rank) / (kv_lora_rank): HF's default eps, not rms_norm_eps.
  auto latent_norm = [&](const std::string& name, int64_t width) {
    Norm n = load_norm(l, c, name, width);
    n.eps = static_cast<float>(m.latent_norm_eps);
    return n;
  };
  const bool bias = c.attention_qkv_bias;  // q_a_proj and kv_a_proj_with_mqa
  if (m.q_lora_rank) {
    METRALE_CHECK(!l.has(p + "q_proj.weight"), c.source, ": q_lora_rank is ", *m.q_lora_rank,
                  " but the checkpoint has a full-rank '", p, "q_proj.weight' (expected null)");
    a->q_a_ = load_linear(l, p + "q_a_proj", *m.q_lora_rank, H, bias);
    a->q_a_norm_ = latent_norm(p + "q_a_layernorm.weight", *m.q_lora_rank);
    a->q_ = load_linear(l, p + "q_b_proj", N * (nope + rope), *m.q_lora_rank, false);
  } else {
    METRALE_CHECK(!l.has(p + "q_a_proj.weight"), c.source,
                  ": q_lora_rank is null but the checkpoint has '", p, "q_a_proj.weight'");
    a->q_ = load_linear(l, p + "q_proj", N * (nope + rope), H, false);
  }
  a->kv_a_ = load_linear(l, p + "kv_a_proj_with_mqa", R + rope, H, bias);
  a->kv_a_norm_ = latent_norm(p + "kv_a_layernorm.weight", R);
  // kv_b_proj [N * (nope + V), R]: per head nope key rows, then V value rows. The per-head
  // matrices keep bf16 when every value is one (a bf16 checkpoint: a rearrangement, no
  // rounding), half the bytes of f32; otherwise (f32 checkpoints, fp8 decoded with its
  // scales) f32. Their inputs stay f32 under --compute bf16 too (derived_matrix): rounding
  // q_nope and the attention's latent output to bf16 moved deepseek_v3_mtp_bf16's logits past
  // the bf16 tolerance (mean 0.070 from HF's native bf16, against 0.05), for a product that
  // is 2-4% of a prefill. All heads share one name: linears() runs them as one op, profiled
  // under it.
  const std::vector<float> kv_b = l.linear_floats(p + "kv_b_proj", N * (nope + V), R);
  const bool bf16 = std::all_of(kv_b.begin(), kv_b.end(),
                                [](float x) { return bf16_to_f32(f32_to_bf16(x)) == x; });
  std::vector<float> k_t(static_cast<size_t>(R * nope)), v(static_cast<size_t>(V * R));
  std::vector<uint16_t> k_t16(bf16 ? k_t.size() : 0), v16(bf16 ? v.size() : 0);
  auto derived = [&](const std::string& name, int64_t n_out, int64_t n_in,
                     const std::vector<float>& x, std::vector<uint16_t>& x16) {
    if (!bf16) return l.derived_matrix(name, n_out, n_in, x);
    std::transform(x.begin(), x.end(), x16.begin(), f32_to_bf16);
    return l.derived_matrix(name, n_out, n_in, std::span<const uint16_t>(x16));
  };
  for (int64_t h = 0; h < N; ++h) {
    const float* rows = kv_b.data() + h * (nope + V) * R;
    for (int64_t j = 0; j < nope; ++j)
      for (int64_t r = 0; r < R; ++r) k_t[static_cast<size_t>(r * nope + j)] = rows[j * R + r];
    std::copy(rows + nope * R, rows + (nope + V) * R, v.begin());
    a->k_absorb_.push_back(
        derived(p + "kv_b_proj (key rows of each head, transposed)", R, nope, k_t, k_t16));
    a->v_up_.push_back(derived(p + "kv_b_proj (value rows of each head)", V, R, v, v16));
  }
  a->o_ = load_linear(l, p + "o_proj", H, N * V, c.attention_out_bias);
  return a;
}

void MlaAttention::record(Graph& g, const BlockIo& io) const {
  const int64_t N = n_heads_, R = kv_rank_, qk = nope_dim_ + rope_dim_;
  const Tensor q = g.buffer("q", N * qk);
  if (!q_a_.empty()) {
    const Tensor qa = g.buffer("q_a", q_a_.n_out());
    q_a_.record(g, io.x, qa);
    q_a_norm_.record(g, qa, qa);
    q_.record(g, qa, q);
  } else {
    q_.record(g, io.x, q);
  }
  const Tensor ckv = g.buffer("kv_a", R + rope_dim_);
  kv_a_.record(g, io.x, ckv);
  kv_a_norm_.record(g, ckv.cols(0, R), ckv.cols(0, R));
  g.add(node::Rope{.x = q, .n_heads = N, .head_dim = qk, .offset = nope_dim_, .pairs = pairs_});
  g.add(node::Rope{
      .x = ckv.cols(R, rope_dim_), .n_heads = 1, .head_dim = rope_dim_, .pairs = pairs_});
  const Tensor q_latent = g.buffer("q_latent", N * R);
  per_head(g, k_absorb_, [&](int64_t h) -> node::Linears::Call {
    return {q.cols(h * qk, nope_dim_), &k_absorb_[static_cast<size_t>(h)], q_latent.cols(h * R, R)};
  });
  const Tensor latent_out = g.buffer("latent_out", N * R);
  g.add(node::LatentAttention{.q_latent = q_latent,
                              .q = q,
                              .nope_dim = nope_dim_,
                              .kv = ckv,
                              .out = latent_out,
                              .layer = io.layer,
                              .n_heads = N,
                              .kv_rank = R,
                              .scale = scale_});
  const Tensor attn = g.buffer("attn", N * v_dim_);
  per_head(g, v_up_, [&](int64_t h) -> node::Linears::Call {
    return {latent_out.cols(h * R, R), &v_up_[static_cast<size_t>(h)],
            attn.cols(h * v_dim_, v_dim_)};
  });
  o_.record(g, attn, io.out);
}

std::string MlaAttention::describe() const {
  std::ostringstream os;
  os << "mla " << n_heads_ << " heads, ";
  if (!q_a_.empty()) os << "q_lora " << q_a_.n_out() << ", ";
  os << "kv_lora " << kv_rank_ << ", nope " << nope_dim_ << " + rope " << rope_dim_ << ", v "
     << v_dim_ << (pairs_ ? ", interleaved rope" : "") << "; latent KV "
     << kv_shape().bytes_per_token() << " B/token (uncompressed "
     << uncompressed_kv_shape().bytes_per_token() << ")";
  return os.str();
}

uint64_t MlaAttention::active_bytes_per_token() const {
  uint64_t b = q_a_.bytes() + q_.bytes() + kv_a_.bytes() + o_.bytes();
  for (const WeightTensor& w : k_absorb_) b += weight_bytes(w);
  for (const WeightTensor& w : v_up_) b += weight_bytes(w);
  return b;
}

}  // namespace metrale
