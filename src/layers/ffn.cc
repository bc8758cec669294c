#include "layers/ffn.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace metrale {

Activation activation_for(const ModelConfig& c) {
  if (c.hidden_act == "silu" || c.hidden_act == "swish") return Activation::kSilu;
  if (c.hidden_act == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  throw make_error(c.source, ": hidden_act '", c.hidden_act,
                   "' is not supported (expected silu or gelu_pytorch_tanh)");
}

std::unique_ptr<DenseFfn> DenseFfn::load(const ModelConfig& c, TensorLoader& l,
                                         const std::string& p, int64_t intermediate) {
  auto f = std::make_unique<DenseFfn>();
  const int64_t H = c.hidden_size, I = intermediate;
  if (l.has(p + "gate_up_proj.weight")) {  // GLM-4 (Glm4vTextMLP): one [gate | up] tensor
    f->gate_up_ = load_linear(l, p + "gate_up_proj", 2 * I, H, c.mlp_bias);
  } else {
    f->gate_up_ = load_linear(l, {p + "gate_proj", p + "up_proj"}, {I, I}, H, c.mlp_bias);
  }
  f->down_ = load_linear(l, p + "down_proj", H, I, c.mlp_bias);
  f->act_ = activation_for(c);
  return f;
}

void DenseFfn::record(Graph& g, const BlockIo& io) const {
  const int64_t I = down_.n_in();
  const Tensor gu = g.buffer("gate_up", 2 * I);
  const Tensor gate = gu.cols(0, I);
  gate_up_.record(g, io.x, gu);
  g.add(node::GatedActivation{.gate = gate, .up = gu.cols(I, I), .out = gate, .act = act_});
  down_.record(g, gate, io.out);
}

std::string DenseFfn::describe() const {
  std::ostringstream os;
  os << "mlp " << down_.n_in();
  return os.str();
}

uint64_t DenseFfn::active_bytes_per_token() const { return gate_up_.bytes() + down_.bytes(); }

std::unique_ptr<MoeFfn> MoeFfn::load(const ModelConfig& c, TensorLoader& l, const std::string& p) {
  const MoeConfig& m = c.moe;
  const int64_t H = c.hidden_size, I = m.moe_intermediate_size, E = m.n_experts;
  METRALE_CHECK(E > 0 && I > 0 && m.n_experts_per_tok >= 1 && m.n_experts_per_tok <= E, c.source,
                ": MoE needs num_experts > 0, moe_intermediate_size > 0 and 1 <= "
                "num_experts_per_tok <= num_experts;"
                " found ",
                E, ", ", I, ", ", m.n_experts_per_tok);
  METRALE_CHECK(m.scoring == MoeScoring::kSigmoid || (m.n_shared_experts == 0 && m.n_group == 1),
                c.source, ": softmax routing comes without ungated shared experts or groups");
  METRALE_CHECK(m.shared_expert_intermediate_size == 0 || m.has_shared_expert_gate, c.source,
                ": a shared expert without its sigmoid gate is not supported");
  auto f = std::make_unique<MoeFfn>();
  f->prefix_ = p;
  f->top_k_ = m.n_experts_per_tok;
  f->normalize_ = m.norm_topk_prob;
  f->act_ = activation_for(c);
  if (m.scoring == MoeScoring::kSoftmax) {
    f->router_ = load_linear(l, p + "gate", E, H, false);
  } else {
    // DeepseekV3TopkRouter / Glm4MoeTopkRouter hold a bare parameter, not an nn.Linear, so a
    // quantization config never covers it: FP8 checkpoints ship it plain. The config parser
    // checked the group counts.
    f->router_ = Linear::separate({l.matrix(p + "gate.weight", E, H)}, {{p + "gate", 0, E}});
    METRALE_CHECK(E % m.n_group == 0 && m.topk_group <= m.n_group, c.source, ": n_group ",
                  m.n_group, " / topk_group ", m.topk_group, " do not fit ", E, " experts");
    f->scoring_ = RouteScoring::kSigmoid;
    f->n_group_ = m.n_group;
    f->topk_group_ = m.topk_group;
    f->scale_ = static_cast<float>(m.routed_scaling_factor);
    if (m.has_e_score_correction_bias)
      f->correction_bias_ = l.device_floats(p + "gate.e_score_correction_bias", {E});
    else
      f->correction_bias_ = DeviceFloats(l.backend(), std::vector<float>(static_cast<size_t>(E)));
  }
  f->experts_.resize(static_cast<size_t>(E));
  const std::string fused_gate_up = p + "experts.gate_up_proj";
  if (l.has(fused_gate_up)) {
    // Qwen3-VL-MoE's published checkpoints hold each stack transposed; transformers' conversion
    // mapping transposes a tensor whose shape is not the in-memory one, and so does this.
    const bool transposable = c.model_type == "qwen3_vl_moe";
    auto stack = [&](const std::string& name, int64_t n_out, int64_t n_in) {
      const CheckpointTensor* t = l.checkpoint().find(name);
      if (!transposable || t == nullptr || n_out == n_in)
        return l.stacked_matrices(name, E, n_out, n_in);
      const Shape shape = t->info->shape, as_is{E, n_out, n_in}, flipped{E, n_in, n_out};
      METRALE_CHECK(shape == as_is || shape == flipped, l.checkpoint().dir().string(), ": tensor '",
                    name, "' has shape ", shape.str(), ", expected ", as_is.str(),
                    " (transformers' layout) or ", flipped.str(),
                    " (the published one) from config.json");
      return shape == as_is ? l.stacked_matrices(name, E, n_out, n_in)
                            : l.stacked_matrices_transposed(name, E, n_out, n_in);
    };
    std::vector<WeightTensor> gu = stack(fused_gate_up, 2 * I, H);
    std::vector<WeightTensor> down = stack(p + "experts.down_proj", H, I);
    for (size_t e = 0; e < gu.size(); ++e) f->experts_[e] = {std::move(gu[e]), std::move(down[e])};
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const std::string pe = p + "experts." + std::to_string(e) + ".";
      MoeExpertWeights& w = f->experts_[static_cast<size_t>(e)];
      // Always one [2I, H] matrix: the MoE op reads an expert's gate and up in one pass.
      w.gate_up = l.fused_linear({pe + "gate_proj", pe + "up_proj"}, {I, I}, H, false);
      w.down = l.linear(pe + "down_proj", H, I, false);
    }
  }
  if (m.shared_expert_intermediate_size > 0) {
    f->shared_ = DenseFfn::load(c, l, p + "shared_expert.", m.shared_expert_intermediate_size);
    f->shared_gate_ = load_linear(l, p + "shared_expert_gate", 1, H, false);
  } else if (m.n_shared_experts > 0) {  // DeepSeek-V3 / GLM-4.5: one ungated MLP
    f->shared_ = DenseFfn::load(c, l, p + "shared_experts.", m.n_shared_experts * I);
  }
  // An expert past num_experts means the config undercounts the checkpoint's experts.
  const std::string extra = p + "experts." + std::to_string(E) + ".gate_proj.weight";
  METRALE_CHECK(!l.has(extra), l.checkpoint().dir().string(), ": tensor '", extra,
                "' exists but config.json's ", "num_experts is ", E);
  return f;
}

void MoeFfn::record(Graph& g, const BlockIo& io) const {
  const Tensor logits = g.buffer("router_logits", n_experts());
  const Tensor ids = g.buffer("experts", top_k_, RowSpace::kRows, BufferKind::kPackedI32);
  const Tensor weights = g.buffer("weights", top_k_, RowSpace::kRows, BufferKind::kPackedF32);
  router_.record(g, io.x, logits);
  g.add(node::Route{.logits = logits,
                    .top_k = top_k_,
                    .normalize = normalize_,
                    .experts = ids,
                    .weights = weights,
                    .scoring = scoring_,
                    .correction_bias = correction_bias_.span(),
                    .n_group = n_group_,
                    .topk_group = topk_group_,
                    .scale = scale_});
  g.add(node::Moe{.x = io.x,
                  .experts = ids,
                  .weights = weights,
                  .top_k = top_k_,
                  .expert_weights = experts_,
                  .act = act_,
                  .out = io.out,
                  .gate_up_lora = expert_lora_gate_up_,
                  .down_lora = expert_lora_down_});
  if (shared_) {
    // HF: routed + sigmoid(shared_expert_gate(x)) * shared_expert(x), or (DeepSeek-V3,
    // GLM-4.5) routed + shared_experts(x).
    const Tensor shared = g.buffer("shared", io.out.n_cols);
    {
      const Graph::Scope scope(g, "shared");
      shared_->record(g, {.x = io.x, .out = shared, .layer = io.layer});
    }
    if (!shared_gate_.empty()) {
      const Tensor gate = g.buffer("shared_gate", 1);
      shared_gate_.record(g, io.x, gate);
      g.add(node::SigmoidMul{.gate = gate, .y = shared});
    }
    g.add(node::Add{.x = shared, .y = io.out});
  }
}

void MoeFfn::lora_sites(LoraSites& out) {
  out.linears.push_back(&router_);
  if (shared_) shared_->lora_sites(out);
  if (!shared_gate_.empty()) out.linears.push_back(&shared_gate_);
  out.experts.push_back({.prefix = prefix_ + "experts",
                         .n_experts = n_experts(),
                         .hidden = router_.n_in(),
                         .intermediate = experts_[0].down.n_in,
                         .gate_up = &expert_lora_gate_up_,
                         .down = &expert_lora_down_});
}

std::string MoeFfn::describe() const {
  std::ostringstream os;
  os << "moe " << n_experts() << " experts x " << experts_[0].down.n_in << ", top-" << top_k_
     << (normalize_ ? " (renormalised)" : "");
  if (scoring_ == RouteScoring::kSigmoid) {
    os << ", sigmoid + correction bias";
    if (n_group_ > 1) os << ", " << topk_group_ << " of " << n_group_ << " groups";
    if (scale_ != 1.0f) os << ", x" << scale_;
  }
  if (shared_)
    os << (shared_gate_.empty() ? ", shared " : ", gated shared ") << shared_->describe();
  return os.str();
}

uint64_t MoeFfn::active_bytes_per_token() const {
  const uint64_t routed =
      router_.bytes() + static_cast<uint64_t>(top_k_) *
                            (weight_bytes(experts_[0].gate_up) + weight_bytes(experts_[0].down));
  return routed + (shared_ ? shared_->active_bytes_per_token() + shared_gate_.bytes() : 0);
}

}  // namespace metrale
