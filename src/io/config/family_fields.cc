// Layer kinds and the family-specific blocks (MoE routing, MLA, gated delta net), each read as
// the HF configuration class defaults it and the modeling class uses it.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "io/config/parse_parts.h"

namespace metrale::config_detail {
namespace {

// A sliding window as HF resolves it. `absent_default` is the dataclass default used when the
// key is missing entirely; an explicit null means "no window".
std::optional<int64_t> window_field(const JsonFields& text, int64_t absent_default) {
  if (!text.object().contains("sliding_window")) return absent_default;
  std::optional<int64_t> w = text.opt_int("sliding_window");
  if (w && *w <= 0)
    throw text.error("sliding_window", "expected a positive integer or null, found ", *w);
  return w;
}

std::vector<LayerKind> kinds_from_layer_types(const JsonFields& text, int64_t n_layers,
                                              std::initializer_list<LayerKind> allowed) {
  const nlohmann::json& list = text.object().at("layer_types");
  if (!list.is_array()) {
    throw text.error("layer_types", "expected a list of strings, found ",
                     describe_json_value(list));
  }
  if (static_cast<int64_t>(list.size()) != n_layers) {
    throw text.error("layer_types", "expected ", n_layers, " entries (num_hidden_layers), found ",
                     list.size());
  }
  std::vector<LayerKind> kinds;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& e = list[i];
    std::string name = e.is_string() ? e.get<std::string>() : std::string();
    auto match = std::find_if(allowed.begin(), allowed.end(), [&](LayerKind k) {
      return e.is_string() && layer_kind_name(k) == name;
    });
    if (match == allowed.end()) {
      std::string expected;
      for (LayerKind k : allowed)
        expected += (expected.empty() ? "\"" : ", \"") + std::string(layer_kind_name(k)) + "\"";
      throw text.error("layer_types", "entry ", i, ": unknown layer type ", describe_json_value(e),
                       " (expected one of ", expected, ")");
    }
    kinds.push_back(*match);
  }
  return kinds;
}

// The routed-expert count and the key it was read from. Qwen3MoeConfig.attribute_map aliases
// num_experts to num_local_experts: transformers 5's save_pretrained writes num_local_experts,
// published (4.x) checkpoints write num_experts, and from_pretrained accepts either (with both
// present it keeps num_local_experts, so two different values are refused here); so does
// Qwen3VLMoeTextConfig. Qwen3Next and Qwen3.5-MoE have no alias and read num_experts only.
std::pair<int64_t, const char*> expert_count(const JsonFields& text,
                                             const ModelTypeTraits& traits) {
  if (traits.family == Family::kDeepseekMoe) {
    return {text.req_size("n_routed_experts"), "n_routed_experts"};
  }
  const bool aliased = traits.model_type == "qwen3_moe" || traits.model_type == "qwen3_vl_moe";
  const bool has_local = text.has("num_local_experts");
  if (aliased && has_local) {
    const int64_t local = text.req_size("num_local_experts");
    if (text.has("num_experts")) {
      const int64_t plain = text.req_size("num_experts");
      if (plain != local) {
        throw text.error("num_local_experts", "expected the same expert count as num_experts ",
                         plain, " (two spellings of one field), found ", local);
      }
    }
    return {local, "num_local_experts"};
  }
  if (!text.has("num_experts")) {
    if (aliased) {
      throw text.missing("num_experts",
                         "a positive integer; transformers 5 writes it as 'num_local_experts'");
    }
    if (has_local) {
      throw text.missing("num_experts", "a positive integer; model_type \"" +
                                            std::string(traits.model_type) +
                                            "\" does not read 'num_local_experts'");
    }
  }
  return {text.req_size("num_experts"), "num_experts"};
}

}  // namespace

void parse_layer_kinds(const JsonFields& text, const ModelTypeTraits& traits, ModelConfig& config) {
  const int64_t n = config.n_layers;
  std::vector<LayerKind>& kinds = config.layer_kinds;
  kinds.assign(static_cast<size_t>(n), LayerKind::kFullAttention);
  switch (traits.sliding) {
    case SlidingRule::kNone:
      if (traits.family == Family::kQwenHybrid) {
        if (text.has("layer_types")) {
          kinds = kinds_from_layer_types(text, n,
                                         {LayerKind::kFullAttention, LayerKind::kLinearAttention});
        } else {
          // Qwen3NextConfig / Qwen3_5TextConfig.__post_init__: every interval-th layer is full.
          int64_t interval = text.int_at_least("full_attention_interval", 4, 1);
          for (int64_t i = 0; i < n; ++i) {
            kinds[static_cast<size_t>(i)] =
                (i + 1) % interval != 0 ? LayerKind::kLinearAttention : LayerKind::kFullAttention;
          }
        }
      }
      return;
    case SlidingRule::kAllIfWindow:  // MistralAttention: sliding_window=config.sliding_window
      config.sliding_window = window_field(text, 4096);
      break;
    case SlidingRule::kAllIfUse:  // Qwen3MoeConfig: sliding_window kept only if use_sliding_window
      config.sliding_window =
          text.bool_or("use_sliding_window", false) ? window_field(text, 4096) : std::nullopt;
      break;
    case SlidingRule::kQwenMaxWindow: {
      config.sliding_window =
          text.bool_or("use_sliding_window", false) ? window_field(text, 4096) : std::nullopt;
      if (text.has("layer_types")) {
        kinds = kinds_from_layer_types(text, n,
                                       {LayerKind::kFullAttention, LayerKind::kSlidingAttention});
        // Qwen2Attention: sliding_window = config.sliding_window if sliding layer else None, so a
        // "sliding" layer without a window attends fully.
        if (!config.sliding_window)
          std::fill(kinds.begin(), kinds.end(), LayerKind::kFullAttention);
      } else if (config.sliding_window) {
        int64_t max_window_layers = text.int_at_least("max_window_layers", 28, 0);
        for (int64_t i = max_window_layers; i < n; ++i)
          kinds[static_cast<size_t>(i)] = LayerKind::kSlidingAttention;
      }
      return;
    }
  }
  if (config.sliding_window) std::fill(kinds.begin(), kinds.end(), LayerKind::kSlidingAttention);
}

void parse_moe(const JsonFields& text, const ModelTypeTraits& traits, ModelConfig& config) {
  if (!traits.moe) return;
  MoeConfig& moe = config.moe;
  const bool deepseek = traits.family == Family::kDeepseekMoe;
  const bool is_deepseek_v3 = traits.model_type == "deepseek_v3";
  const auto [n_experts, experts_key] = expert_count(text, traits);
  moe.n_experts = n_experts;
  moe.n_experts_per_tok = text.req_size("num_experts_per_tok");
  moe.moe_intermediate_size = text.req_size("moe_intermediate_size");
  if (moe.n_experts_per_tok > moe.n_experts) {
    throw text.error("num_experts_per_tok", "expected at most the number of experts (", experts_key,
                     ") ", moe.n_experts, ", found ", moe.n_experts_per_tok);
  }
  if (deepseek) {
    // DeepseekV3TopkRouter / Glm4MoeTopkRouter: sigmoid scores, e_score_correction_bias added for
    // the choice only, group-limited top-k (groups ranked by their top-2 sum), then optional
    // renormalisation and routed_scaling_factor. No other topk_method/scoring_func is coded.
    moe.scoring = MoeScoring::kSigmoid;
    moe.has_e_score_correction_bias = true;
    if (std::optional<std::string> s = text.opt_string("scoring_func"); s && *s != "sigmoid") {
      throw text.error("scoring_func", "expected \"sigmoid\" (", traits.modeling_class,
                       "'s router), found \"", *s, "\"");
    }
    if (std::optional<std::string> s = text.opt_string("topk_method"); s && *s != "noaux_tc") {
      throw text.error("topk_method", "expected \"noaux_tc\" (", traits.modeling_class,
                       "'s router), found \"", *s, "\"");
    }
    moe.n_shared_experts = text.int_at_least("n_shared_experts", 1, 0);
    moe.routed_scaling_factor =
        text.positive_number_or("routed_scaling_factor", is_deepseek_v3 ? 2.5 : 1.0);
    moe.n_group = text.int_at_least("n_group", is_deepseek_v3 ? 8 : 1, 1);
    moe.topk_group = text.int_at_least("topk_group", is_deepseek_v3 ? 4 : 1, 1);
    moe.first_k_dense_replace =
        text.int_at_least("first_k_dense_replace", is_deepseek_v3 ? 3 : 1, 0);
    moe.norm_topk_prob = text.bool_or("norm_topk_prob", true);
    if (moe.n_experts % moe.n_group != 0) {
      throw text.error("n_group", "expected a divisor of the expert count ", moe.n_experts,
                       ", found ", moe.n_group);
    }
    if (moe.n_experts / moe.n_group < 2) {
      throw text.error("n_group",
                       "each group needs >= 2 experts (groups are scored by their top-2), found ",
                       moe.n_experts / moe.n_group, " per group");
    }
    if (moe.topk_group > moe.n_group) {
      throw text.error("topk_group", "expected at most n_group ", moe.n_group, ", found ",
                       moe.topk_group);
    }
    // Up to the last MTP layer's index: a model whose MTP layers are dense too (vLLM and
    // transformers decide dense vs MoE by the same rule at the MTP layer's index).
    if (moe.first_k_dense_replace > config.n_layers + config.n_mtp_layers) {
      throw text.error(
          "first_k_dense_replace", "expected at most num_hidden_layers + num_nextn_predict_layers ",
          config.n_layers + config.n_mtp_layers, ", found ", moe.first_k_dense_replace);
    }
    return;
  }
  moe.scoring = MoeScoring::kSoftmax;
  if (traits.model_type.starts_with("qwen3_5_moe")) {
    // Qwen3_5MoeTopKRouter always renormalises, and Qwen3_5MoeDecoderLayer makes every layer
    // sparse: norm_topk_prob / decoder_sparse_step / mlp_only_layers are not read.
    moe.norm_topk_prob = true;
  } else {
    // Qwen3VLMoeTextTopKRouter always renormalises (the config has no norm_topk_prob).
    const bool always = traits.model_type == "qwen3_vl_moe";
    moe.norm_topk_prob =
        always || text.bool_or("norm_topk_prob", traits.model_type == "qwen3_next");
    moe.decoder_sparse_step = text.int_at_least("decoder_sparse_step", 1, 1);
    moe.mlp_only_layers = text.opt_int_list("mlp_only_layers", 0).value_or(std::vector<int64_t>{});
    for (size_t i = 0; i < moe.mlp_only_layers.size(); ++i) {
      if (moe.mlp_only_layers[i] >= config.n_layers) {
        throw text.error("mlp_only_layers", "element ", i, ": expected a layer index in [0, ",
                         config.n_layers, ") (num_hidden_layers), found ", moe.mlp_only_layers[i]);
      }
    }
  }
  if (traits.family == Family::kQwenHybrid) {
    // Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock: one shared expert gated by
    // sigmoid(shared_expert_gate(x)).
    moe.shared_expert_intermediate_size = text.req_size("shared_expert_intermediate_size");
    moe.has_shared_expert_gate = true;
  }
}

void parse_mla(const JsonFields& text, ModelConfig& config) {
  MlaConfig& mla = config.mla;
  if (!text.object().contains("q_lora_rank")) {
    throw text.missing("q_lora_rank", "a positive integer, or null for a full-rank q_proj");
  }
  mla.q_lora_rank = text.opt_int("q_lora_rank");
  if (mla.q_lora_rank && *mla.q_lora_rank <= 0) {
    throw text.error("q_lora_rank", "expected a positive integer or null, found ",
                     *mla.q_lora_rank);
  }
  mla.kv_lora_rank = text.req_size("kv_lora_rank");
  mla.qk_nope_head_dim = text.req_size("qk_nope_head_dim");
  mla.qk_rope_head_dim = text.req_size("qk_rope_head_dim");
  mla.v_head_dim = text.req_size("v_head_dim");
}

void parse_linear_attention(const JsonFields& text, ModelConfig& config) {
  LinearAttentionConfig& lin = config.linear;
  lin.n_key_heads = text.req_size("linear_num_key_heads");
  lin.n_value_heads = text.req_size("linear_num_value_heads");
  lin.key_head_dim = text.req_size("linear_key_head_dim");
  lin.value_head_dim = text.req_size("linear_value_head_dim");
  lin.conv_kernel_dim = text.req_size("linear_conv_kernel_dim");
  if (lin.n_value_heads % lin.n_key_heads != 0) {
    throw text.error("linear_num_value_heads", "expected a multiple of linear_num_key_heads ",
                     lin.n_key_heads, ", found ", lin.n_value_heads);
  }
}

}  // namespace metrale::config_detail
