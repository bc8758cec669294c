#pragma once
// Per-model-type facts the parser and the predicates need, one row per HF model type. Each
// value is read off transformers 5.x configuration_<type>.py (defaults) and modeling_<type>.py
// (how a field is used); the comment on each column says where.
#include <cstdint>
#include <optional>
#include <string_view>

namespace metrale::config_detail {

// How HF fills head_dim when config.json omits it.
enum class HeadDimDefault : uint8_t {
  kHiddenOverHeads,  // getattr(config, "head_dim", hidden_size // num_attention_heads)
  kFixed,            // a dataclass default (Qwen3: 128, Qwen3-Next / Qwen3.5: 256)
  kQkRopeHeadDim,    // DeepseekV3Config.__post_init__: head_dim = qk_rope_head_dim
};

// How HF decides which layers use a sliding window.
enum class SlidingRule : uint8_t {
  kNone,           // no sliding-window support in the modeling file
  kAllIfWindow,    // Mistral: every layer, whenever sliding_window is not null
  kAllIfUse,       // Qwen3-MoE: every layer, when use_sliding_window
  kQwenMaxWindow,  // Qwen2/Qwen3: layer_types, else sliding for i >= max_window_layers
};

// Where an attention projection's bias comes from.
enum class BiasRule : uint8_t {
  kNever,   // bias=False in the modeling file
  kAlways,  // bias=True regardless of config (Qwen2's q/k/v)
  kConfig,  // bias=config.attention_bias
};

enum class Family : uint8_t {
  kDense,        // llama, mistral, qwen2, qwen3
  kQwenMoe,      // qwen3_moe: softmax router, decoder_sparse_step / mlp_only_layers
  kQwenHybrid,   // qwen3_next, qwen3_5, qwen3_5_moe: GDN + gated attention
  kDeepseekMoe,  // deepseek_v3, glm4_moe: sigmoid router + correction bias, first_k_dense_replace
};

struct ModelTypeTraits {
  std::string_view model_type;
  std::string_view modeling_class;  // the HF decoder class, for messages
  Family family;
  bool nested_text_config;  // VL checkpoint: text model under "text_config"
  bool moe;                 // routed experts exist
  HeadDimDefault head_dim_default;
  int64_t head_dim_fixed;  // for kFixed
  // num_key_value_heads absent: true -> = num_attention_heads (HF None default); false -> the
  // field is required (HF's numeric default would be some other model's).
  bool kv_heads_default_to_heads;
  double partial_rotary_default;  // __post_init__ kwargs.setdefault("partial_rotary_factor", x)
  double rms_norm_eps_default;
  int64_t max_position_default;
  std::optional<int64_t> bos_default;
  std::optional<int64_t> eos_default;
  SlidingRule sliding;
  BiasRule qkv_bias;        // q/k/v (MLA: q_a_proj, kv_a_proj_with_mqa) bias
  BiasRule out_bias;        // o_proj bias
  bool qk_norm;             // q_norm/k_norm built unconditionally (glm4_moe: use_qk_norm)
  bool output_gate;         // q_proj doubled and chunked into [q, gate]
  bool vanilla_norm;        // decoder RMSNorm is x*w (true) or x*(1+w) (false)
  bool has_mlp_bias_field;  // llama's mlp_bias
  double rope_theta_default = 10000.0;  // the config class's default_theta
};

// The row for `model_type`, or nullptr when unknown.
const ModelTypeTraits* find_model_type(std::string_view model_type);
// The row for `model_type`; unknown -> Error listing the supported types.
const ModelTypeTraits& model_type_traits(std::string_view model_type);

}  // namespace metrale::config_detail
