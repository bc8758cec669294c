// The per-model-type table and the predicates decided by it. Every row was read off
// transformers 5.x (models/<type>/configuration_<type>.py and modeling_<type>.py); the
// fixtures script tools/fixtures/configs/make_expectations.py re-derives the testable columns
// from the installed transformers so tests catch a drift.
#include <string>

#include "core/error.h"
#include "io/config/model_config.h"
#include "io/config/model_types.h"

namespace metrale {
namespace config_detail {
namespace {

using enum HeadDimDefault;
using enum SlidingRule;
using enum Family;
using enum BiasRule;

// clang-format off
// vanilla_norm: which RMSNorm class the decoder layers, the final norm and q_norm/k_norm use.
//   LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm, Qwen3MoeRMSNorm,
//   DeepseekV3RMSNorm, Glm4MoeRMSNorm: weight init ones, `return self.weight * x` -> vanilla.
//   Qwen3NextRMSNorm, Qwen3_5RMSNorm, Qwen3_5MoeRMSNorm: weight init zeros,
//   `output * (1.0 + self.weight.float())` -> offsets from one.
//   (The gated norm inside the GDN layers, *RMSNormGated, is x*w in all three hybrid types; it
//   is not covered by this predicate.)
constexpr ModelTypeTraits kTypes[] = {
  {.model_type = "llama", .modeling_class = "LlamaDecoderLayer", .family = kDense,
   .nested_text_config = false, .moe = false, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = true, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-6,
   .max_position_default = 2048, .bos_default = 1, .eos_default = 2, .sliding = kNone,
   .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = false, .output_gate = false,
   .vanilla_norm = true, .has_mlp_bias_field = true},
  {.model_type = "mistral", .modeling_class = "MistralDecoderLayer", .family = kDense,
   .nested_text_config = false, .moe = false, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-6,
   .max_position_default = 4096 * 32, .bos_default = 1, .eos_default = 2, .sliding = kAllIfWindow,
   .qkv_bias = kNever, .out_bias = kNever, .qk_norm = false, .output_gate = false,
   .vanilla_norm = true, .has_mlp_bias_field = false},
  {.model_type = "qwen2", .modeling_class = "Qwen2DecoderLayer", .family = kDense,
   .nested_text_config = false, .moe = false, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-6,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kQwenMaxWindow, .qkv_bias = kAlways, .out_bias = kNever, .qk_norm = false,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false},
  // Qwen2VLTextConfig (text model "qwen2_vl_text"; pre-v5 checkpoints are flat): Qwen2's
  // decoder with a sectioned multimodal rope, default_theta 1e6.
  {.model_type = "qwen2_vl", .modeling_class = "Qwen2VLDecoderLayer", .family = kDense,
   .nested_text_config = true, .moe = false, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = true, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-5,
   .max_position_default = 32768, .bos_default = 151643, .eos_default = 151645,
   .sliding = kQwenMaxWindow, .qkv_bias = kAlways, .out_bias = kNever, .qk_norm = false,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false,
   .rope_theta_default = 1e6},
  // Qwen2_5_VLTextConfig: the same decoder and defaults as Qwen2-VL's.
  {.model_type = "qwen2_5_vl", .modeling_class = "Qwen2_5_VLDecoderLayer", .family = kDense,
   .nested_text_config = true, .moe = false, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = true, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-5,
   .max_position_default = 32768, .bos_default = 151643, .eos_default = 151645,
   .sliding = kQwenMaxWindow, .qkv_bias = kAlways, .out_bias = kNever, .qk_norm = false,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false,
   .rope_theta_default = 1e6},
  {.model_type = "qwen3", .modeling_class = "Qwen3DecoderLayer", .family = kDense,
   .nested_text_config = false, .moe = false, .head_dim_default = kFixed, .head_dim_fixed = 128,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-6,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kQwenMaxWindow, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false},
  // Qwen3VLTextConfig (text model "qwen3_vl_text"): Qwen3's decoder (q/k norms) with the
  // interleaved multimodal rope, default_theta 5e5; the deepstack features come from the tower.
  {.model_type = "qwen3_vl", .modeling_class = "Qwen3VLTextDecoderLayer", .family = kDense,
   .nested_text_config = true, .moe = false, .head_dim_default = kFixed, .head_dim_fixed = 128,
   .kv_heads_default_to_heads = true, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-6,
   .max_position_default = 128000, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false,
   .rope_theta_default = 5e5},
  // Qwen3VLMoeTextConfig (text model "qwen3_vl_moe_text"): qwen3_vl's attention and rope with
  // qwen3_moe's sparse layers (decoder_sparse_step, mlp_only_layers), head_dim defaulting to
  // hidden / heads, a router that always renormalises, fused experts (ffn.h).
  {.model_type = "qwen3_vl_moe", .modeling_class = "Qwen3VLMoeTextDecoderLayer", .family = kQwenMoe,
   .nested_text_config = true, .moe = true, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = true, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-6,
   .max_position_default = 128000, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false,
   .rope_theta_default = 5e5},
  {.model_type = "qwen3_moe", .modeling_class = "Qwen3MoeDecoderLayer", .family = kQwenMoe,
   .nested_text_config = false, .moe = true, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-6,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kAllIfUse, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false},
  {.model_type = "qwen3_next", .modeling_class = "Qwen3NextDecoderLayer", .family = kQwenHybrid,
   .nested_text_config = false, .moe = true, .head_dim_default = kFixed, .head_dim_fixed = 256,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 0.25, .rms_norm_eps_default = 1e-6,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = true, .vanilla_norm = false, .has_mlp_bias_field = false},
  {.model_type = "qwen3_5", .modeling_class = "Qwen3_5DecoderLayer", .family = kQwenHybrid,
   .nested_text_config = true, .moe = false, .head_dim_default = kFixed, .head_dim_fixed = 256,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 0.25, .rms_norm_eps_default = 1e-6,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = true, .vanilla_norm = false, .has_mlp_bias_field = false},
  {.model_type = "qwen3_5_text", .modeling_class = "Qwen3_5DecoderLayer", .family = kQwenHybrid,
   .nested_text_config = false, .moe = false, .head_dim_default = kFixed, .head_dim_fixed = 256,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 0.25, .rms_norm_eps_default = 1e-6,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = true, .vanilla_norm = false, .has_mlp_bias_field = false},
  {.model_type = "qwen3_5_moe", .modeling_class = "Qwen3_5MoeDecoderLayer", .family = kQwenHybrid,
   .nested_text_config = true, .moe = true, .head_dim_default = kFixed, .head_dim_fixed = 256,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 0.25, .rms_norm_eps_default = 1e-6,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = true, .vanilla_norm = false, .has_mlp_bias_field = false},
  {.model_type = "qwen3_5_moe_text", .modeling_class = "Qwen3_5MoeDecoderLayer", .family = kQwenHybrid,
   .nested_text_config = false, .moe = true, .head_dim_default = kFixed, .head_dim_fixed = 256,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 0.25, .rms_norm_eps_default = 1e-6,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = true,
   .output_gate = true, .vanilla_norm = false, .has_mlp_bias_field = false},
  {.model_type = "deepseek_v3", .modeling_class = "DeepseekV3DecoderLayer", .family = kDeepseekMoe,
   .nested_text_config = false, .moe = true, .head_dim_default = kQkRopeHeadDim, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = true, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-6,
   .max_position_default = 4096, .bos_default = 0, .eos_default = 1, .sliding = kNone,
   .qkv_bias = kConfig, .out_bias = kConfig, .qk_norm = false, .output_gate = false,
   .vanilla_norm = true, .has_mlp_bias_field = false},
  // Glm4vTextConfig (text model "glm4v_text"): GLM-4's dense decoder (q/k/v bias, sandwich
  // norms, a fused gate_up_proj) with a sectioned multimodal rope over adjacent pairs
  // (rotate_half_llm), head_dim hidden / heads, num_key_value_heads 2 by default.
  {.model_type = "glm4v", .modeling_class = "Glm4vTextDecoderLayer", .family = kDense,
   .nested_text_config = true, .moe = false, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 1.0, .rms_norm_eps_default = 1e-5,
   .max_position_default = 32768, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kAlways, .out_bias = kNever, .qk_norm = false,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false},
  // Glm4vMoeTextConfig (text model "glm4v_moe_text", GLM-4.5V): glm4_moe's decoder (no qk-norm)
  // with the sectioned multimodal rope on rotate_half; attention_bias defaults to true.
  {.model_type = "glm4v_moe", .modeling_class = "Glm4vMoeTextDecoderLayer", .family = kDeepseekMoe,
   .nested_text_config = true, .moe = true, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 0.5, .rms_norm_eps_default = 1e-5,
   .max_position_default = 65536, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kNever, .qk_norm = false,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false},
  {.model_type = "glm4_moe", .modeling_class = "Glm4MoeDecoderLayer", .family = kDeepseekMoe,
   .nested_text_config = false, .moe = true, .head_dim_default = kHiddenOverHeads, .head_dim_fixed = 0,
   .kv_heads_default_to_heads = false, .partial_rotary_default = 0.5, .rms_norm_eps_default = 1e-5,
   .max_position_default = 131072, .bos_default = std::nullopt, .eos_default = std::nullopt,
   .sliding = kNone, .qkv_bias = kConfig, .out_bias = kNever, .qk_norm = false /* use_qk_norm */,
   .output_gate = false, .vanilla_norm = true, .has_mlp_bias_field = false},
};
// clang-format on

std::string supported_list() {
  std::string out;
  for (const ModelTypeTraits& t : kTypes) {
    if (!out.empty()) out += ", ";
    out += t.model_type;
  }
  return out;
}

}  // namespace

const ModelTypeTraits* find_model_type(std::string_view model_type) {
  for (const ModelTypeTraits& t : kTypes) {
    if (t.model_type == model_type) return &t;
  }
  return nullptr;
}

const ModelTypeTraits& model_type_traits(std::string_view model_type) {
  const ModelTypeTraits* t = find_model_type(model_type);
  if (t == nullptr) {
    throw make_error("unsupported model_type \"", model_type, "\" (supported: ", supported_list(),
                     ")");
  }
  return *t;
}

}  // namespace config_detail

const std::vector<std::string_view>& supported_model_types() {
  static const std::vector<std::string_view> kNames = [] {
    std::vector<std::string_view> names;
    for (const auto& t : config_detail::kTypes) names.push_back(t.model_type);
    return names;
  }();
  return kNames;
}

bool is_supported_model_type(std::string_view model_type) {
  return config_detail::find_model_type(model_type) != nullptr;
}

bool model_type_ships_vanilla_norm_weights(std::string_view model_type) {
  return config_detail::model_type_traits(model_type).vanilla_norm;
}

bool ships_vanilla_norm_weights(const ModelConfig& config) {
  return model_type_ships_vanilla_norm_weights(config.model_type);
}

// Can HF continue a prefill from the cache an earlier chunk of the same prompt left? Read off
// transformers 5.x and confirmed by tools/fixtures/configs/check_chunked_prefill.py (tiny random
// models; chunk splits 6+7, 1+12, 2+1+10 and 4+1+1+7 against one 13-token prefill, with a
// control proving a cacheless second chunk differs). The answer is "yes" for every type here:
//
// - Softmax attention (all types' full / sliding layers): past K/V come from the cache and the
//   causal mask covers the new rows, so chunk boundaries are invisible.
// - Gated delta net (Qwen3NextGatedDeltaNet, Qwen3_5GatedDeltaNet, Qwen3_5MoeGatedDeltaNet):
//   the fused recurrent kernel is taken only when seq_len == 1, but a multi-token chunk is NOT
//   cut off from the cache: cache.update_conv_state() prepends the cached conv window to the new
//   tokens before causal_conv1d_fn (the extra outputs are dropped), and the chunked rule is
//   called with initial_state=recurrent_state. (transformers 4.5x passed initial_state=None and
//   re-padded the conv state from zeros on every multi-token call, which did break chunking; the
//   5.x oracle no longer does.)
// - MLA (DeepseekV3Attention): the cache holds the compressed latents (kv_nope of width
//   kv_lora_rank, k_rot of width qk_rope_head_dim) and every call re-expands the whole cached
//   prefix with kv_b_proj, so a later chunk attends to exactly what a single prefill would.
//   kv_lora_rank therefore changes the cache width, not the answer; q_lora_rank (null or not)
//   only changes how q is projected.
//
// The function still takes kv_lora_rank so a future MLA variant whose cache cannot be continued
// (e.g. one caching post-softmax state) can be told apart; today it only validates it.
bool requires_single_chunk_prefill(std::string_view model_type, int64_t kv_lora_rank) {
  const config_detail::ModelTypeTraits& t = config_detail::model_type_traits(model_type);
  if (kv_lora_rank < 0) throw make_error("kv_lora_rank must be >= 0, found ", kv_lora_rank);
  if (t.head_dim_default == config_detail::HeadDimDefault::kQkRopeHeadDim && kv_lora_rank == 0) {
    throw make_error("model_type \"", model_type,
                     "\" is multi-head latent attention: kv_lora_rank must be > 0");
  }
  return false;
}

bool requires_single_chunk_prefill(const ModelConfig& config) {
  return requires_single_chunk_prefill(config.model_type, config.mla.kv_lora_rank);
}

}  // namespace metrale
