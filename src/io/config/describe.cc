// describe(): the few lines `metrale inspect` prints about a checkpoint's architecture.
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "io/config/model_config.h"

namespace metrale {
namespace {

template <typename T>
std::string join(const std::vector<T>& values) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  os << "]";
  return os.str();
}

std::string layer_summary(const ModelConfig& c) {
  std::map<std::string_view, int64_t> counts;
  for (LayerKind k : c.layer_kinds) ++counts[layer_kind_name(k)];
  if (counts.size() == 1) return std::string(counts.begin()->first);
  std::ostringstream os;
  bool first = true;
  for (const auto& [name, n] : counts) {
    os << (first ? "" : ", ") << n << " " << name;
    first = false;
  }
  return os.str();
}

// Layer indices as comma-separated runs: {0, 2, 3} -> "0,2-3"; {} -> "none".
std::string layer_ranges(const std::vector<int64_t>& layers) {
  if (layers.empty()) return "none";
  std::ostringstream os;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    os << (i ? "," : "") << layers[i];
    if (j > i) os << "-" << layers[j];
    i = j + 1;
  }
  return os.str();
}

std::string quant_method(const std::string& quantization_json) {
  nlohmann::json q = nlohmann::json::parse(quantization_json, nullptr, /*allow_exceptions=*/false);
  if (q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()) {
    return q["quant_method"].get<std::string>();
  }
  return "present";
}

}  // namespace

std::string describe(const ModelConfig& c) {
  std::ostringstream os;
  os << "model_type: " << c.model_type;
  if (c.text_model_type != c.model_type) os << " (text model " << c.text_model_type << ")";
  os << "\n";
  os << "layers: " << c.n_layers << " (" << layer_summary(c) << "), hidden " << c.hidden_size
     << ", vocab " << c.vocab_size << ", dtype "
     << (c.dtype_name.empty() ? "unspecified" : c.dtype_name)
     << (c.tie_word_embeddings ? ", tied embeddings" : "") << "\n";

  os << "attention: " << c.n_heads << " heads, " << c.n_kv_heads << " kv heads, head_dim "
     << c.head_dim;
  if (c.qk_norm) os << ", qk-norm";
  if (c.attention_output_gate) os << ", output gate";
  if (c.attention_qkv_bias) os << ", qkv bias";
  if (c.sliding_window) os << ", sliding window " << *c.sliding_window;
  os << "\n";
  if (c.is_mla()) {
    os << "mla: q_lora_rank " << (c.mla.q_lora_rank ? std::to_string(*c.mla.q_lora_rank) : "none")
       << ", kv_lora_rank " << c.mla.kv_lora_rank << ", qk_nope " << c.mla.qk_nope_head_dim
       << ", qk_rope " << c.mla.qk_rope_head_dim << ", v " << c.mla.v_head_dim << "\n";
  }

  os << "rope: " << rope_type_name(c.rope.type) << ", theta " << c.rope.theta << ", rotary_dim "
     << c.rope.rotary_dim;
  if (c.rope.type != RopeType::kDefault) os << ", factor " << c.rope.factor;
  if (c.rope.original_max_position_embeddings > 0) {
    os << ", original context " << c.rope.original_max_position_embeddings;
  }
  if (!c.rope.mrope_section.empty())
    os << ", mrope " << join(c.rope.mrope_section)
       << (c.rope.mrope_interleaved ? " interleaved" : " sectioned");
  os << ", max positions " << c.max_position_embeddings << "\n";

  if (c.has_linear_attention()) {
    os << "linear attention: " << c.linear.n_key_heads << " key heads x " << c.linear.key_head_dim
       << ", " << c.linear.n_value_heads << " value heads x " << c.linear.value_head_dim
       << ", conv kernel " << c.linear.conv_kernel_dim << "\n";
  }
  if (c.moe.n_experts > 0) {
    const MoeConfig& m = c.moe;
    os << "moe: " << m.n_experts << " experts, top " << m.n_experts_per_tok << ", expert width "
       << m.moe_intermediate_size << ", "
       << (m.scoring == MoeScoring::kSigmoid ? "sigmoid" : "softmax") << ", norm_topk_prob "
       << (m.norm_topk_prob ? "true" : "false");
    if (m.n_group > 1) os << ", groups " << m.topk_group << "/" << m.n_group;
    if (m.routed_scaling_factor != 1.0) os << ", scale " << m.routed_scaling_factor;
    if (m.shared_expert_intermediate_size > 0) {
      os << ", gated shared expert " << m.shared_expert_intermediate_size;
    }
    if (m.n_shared_experts > 0) os << ", " << m.n_shared_experts << " shared";
    os << "\n";
    std::vector<int64_t> sparse, dense;
    for (int64_t i = 0; i < c.n_layers; ++i) (c.is_moe_layer(i) ? sparse : dense).push_back(i);
    os << "moe layers: " << layer_ranges(sparse) << "; dense: " << layer_ranges(dense);
    if (!dense.empty()) os << " (width " << c.intermediate_size << ")";
    os << "\n";
  } else {
    os << "mlp: intermediate " << c.intermediate_size << (c.mlp_bias ? ", bias" : "") << "\n";
  }
  os << "norm: rms eps " << c.rms_norm_eps << ", weights "
     << (ships_vanilla_norm_weights(c) ? "x*w" : "x*(1+w)") << "\n";
  os << "tokens: bos " << (c.bos_token_id ? std::to_string(*c.bos_token_id) : "none") << ", eos "
     << join(c.eos_token_ids) << ", pad "
     << (c.pad_token_id ? std::to_string(*c.pad_token_id) : "none") << "\n";
  if (c.n_mtp_layers > 0) os << "mtp layers: " << c.n_mtp_layers << "\n";
  if (!c.quantization_config_json.empty())
    os << "quantization: " << quant_method(c.quantization_config_json) << "\n";
  if (!c.vision_config_json.empty()) os << "vision tower: present\n";
  return os.str();
}

}  // namespace metrale
