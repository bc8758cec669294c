#include "layers/gated_delta_net.h"

#include <sstream>

#include "core/error.h"
#include "layers/ffn.h"

namespace metrale {

namespace {

TensorLoader::RowGather rows_of_groups(const std::string& name, int64_t n_rows, int64_t n_groups,
                                       int64_t group, int64_t begin, int64_t count) {
  TensorLoader::RowGather g{name, n_rows, {}};
  for (int64_t i = 0; i < n_groups; ++i)
    for (int64_t r = 0; r < count; ++r) g.rows.push_back(i * group + begin + r);
  return g;
}

}  // namespace

std::unique_ptr<GatedDeltaNet> GatedDeltaNet::load(const ModelConfig& c, int64_t layer,
                                                   TensorLoader& l, const std::string& p) {
  METRALE_CHECK(c.layer_kind(layer) == LayerKind::kLinearAttention, c.source, ": layer ", layer,
                " is ", layer_kind_name(c.layer_kind(layer)), ", not linear_attention");
  const LinearAttentionConfig& lin = c.linear;
  auto g = std::make_unique<GatedDeltaNet>();
  g->n_k_heads_ = lin.n_key_heads;
  g->n_v_heads_ = lin.n_value_heads;
  g->k_dim_ = lin.key_head_dim;
  g->v_dim_ = lin.value_head_dim;
  g->kernel_ = lin.conv_kernel_dim;
  METRALE_CHECK(g->kernel_ >= 2, c.source, ": linear_conv_kernel_dim must be >= 2, found ",
                g->kernel_);
  METRALE_CHECK(activation_for(c) == Activation::kSilu, c.source, ": hidden_act '", c.hidden_act,
                "': the Gated DeltaNet conv is implemented with silu only");
  const int64_t H = c.hidden_size, Hk = g->n_k_heads_, Hv = g->n_v_heads_;
  const int64_t Kd = Hk * g->k_dim_, Vd = Hv * g->v_dim_, C = g->conv_channels();
  if (c.model_type == "qwen3_next") {
    // Grouped per key head: regroup into q | k | v | z and b | a (fix_query_key_value_ordering).
    const std::string rq = p + "in_proj_qkvz (regrouped) ", rb = p + "in_proj_ba (regrouped) ";
    const std::vector<Linear::Part> parts = {{rq + "q", 0, Kd},      {rq + "k", Kd, Kd},
                                             {rq + "v", 2 * Kd, Vd}, {rq + "z", C, Vd},
                                             {rb + "b", C + Vd, Hv}, {rb + "a", C + Vd + Hv, Hv}};
    const int64_t r = Hv / Hk, Dk = g->k_dim_, Dv = g->v_dim_;
    const int64_t group = 2 * Dk + 2 * r * Dv, n_qkvz = Hk * group;
    const std::string qkvz = p + "in_proj_qkvz.weight", ba = p + "in_proj_ba.weight";
    TensorLoader::RowGather first{qkvz, n_qkvz, {}};
    for (const auto& [begin, count] :
         {std::pair{int64_t{0}, Dk}, std::pair{Dk, Dk}, std::pair{2 * Dk, r * Dv},
          std::pair{2 * Dk + r * Dv, r * Dv}}) {
      const auto rows = rows_of_groups(qkvz, n_qkvz, Hk, group, begin, count).rows;
      first.rows.insert(first.rows.end(), rows.begin(), rows.end());
    }
    TensorLoader::RowGather second{ba, 2 * Hv, {}};
    for (const int64_t begin : {int64_t{0}, r}) {
      const auto rows = rows_of_groups(ba, 2 * Hv, Hk, 2 * r, begin, r).rows;
      second.rows.insert(second.rows.end(), rows.begin(), rows.end());
    }
    g->in_proj_ = Linear::fused(l.gathered_matrix({first, second}, H, qkvz + "+" + ba), parts);
  } else {
    const std::vector<std::string> names = {p + "in_proj_qkv", p + "in_proj_z", p + "in_proj_b",
                                            p + "in_proj_a"};
    g->in_proj_ = load_linear(l, names, {C, Vd, Hv, Hv}, H, false);
  }
  g->out_proj_ = load_linear(l, p + "out_proj", H, Vd, false);

  const std::vector<float> w = l.floats(p + "conv1d.weight", {C, 1, g->kernel_});
  std::vector<float> conv_w(w.size());
  for (int64_t ch = 0; ch < C; ++ch)
    for (int64_t j = 0; j < g->kernel_; ++j)
      conv_w[static_cast<size_t>(j * C + ch)] = w[static_cast<size_t>(ch * g->kernel_ + j)];
  g->conv_w_ = DeviceFloats(l.backend(), conv_w);
  g->a_log_ = l.device_floats(p + "A_log", {Hv});
  g->dt_bias_ = l.device_floats(p + "dt_bias", {Hv});
  g->norm_.weight = l.norm(p + "norm.weight", g->v_dim_);
  g->norm_.eps = static_cast<float>(c.rms_norm_eps);
  g->norm_.style = NormStyle::kWeight;  // RMSNormGated: weight * norm(x), initialised to ones
  return g;
}

void GatedDeltaNet::record(Graph& g, const BlockIo& io) const {
  const int64_t C = conv_channels();
  const int64_t Kd = n_k_heads_ * k_dim_, Vd = n_v_heads_ * v_dim_, Hv = n_v_heads_;
  const Tensor proj = g.buffer("in_proj", in_proj_.n_out());
  const Tensor mixed = g.buffer("conv", C);
  const Tensor core = g.buffer("core", Vd);
  in_proj_.record(g, io.x, proj);
  g.add(node::CausalConv{.x = proj.cols(0, C),
                         .out = mixed,
                         .weight = conv_w_.data(),
                         .kernel = kernel_,
                         .silu = true,
                         .layer = io.layer});
  g.add(node::DeltaRule{.q = mixed.cols(0, Kd),
                        .k = mixed.cols(Kd, Kd),
                        .v = mixed.cols(2 * Kd, Vd),
                        .a = proj.cols(C + Vd + Hv, Hv),
                        .b = proj.cols(C + Vd, Hv),
                        .a_log = a_log_.data(),
                        .dt_bias = dt_bias_.data(),
                        .n_k_heads = n_k_heads_,
                        .n_v_heads = n_v_heads_,
                        .k_head_dim = k_dim_,
                        .v_head_dim = v_dim_,
                        .out = core,
                        .layer = io.layer});
  g.add(node::RmsNorm{.x = core,
                      .out = core,
                      .weight = norm_.weight.data(),
                      .eps = norm_.eps,
                      .style = norm_.style,
                      .group = v_dim_,
                      .gate = proj.cols(C, Vd)});
  out_proj_.record(g, core, io.out);
}

std::string GatedDeltaNet::describe() const {
  std::ostringstream os;
  os << "gated deltanet " << n_k_heads_ << " k heads x " << k_dim_ << " / " << n_v_heads_
     << " v heads x " << v_dim_ << ", conv " << kernel_;
  return os.str();
}

uint64_t GatedDeltaNet::active_bytes_per_token() const {
  return in_proj_.bytes() + out_proj_.bytes();
}

LayerStateShape GatedDeltaNet::state_shape() const {
  return {.conv_elems = (kernel_ - 1) * conv_channels(), .ssm_elems = n_v_heads_ * k_dim_ * v_dim_};
}

}  // namespace metrale
