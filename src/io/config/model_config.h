#pragma once
// ModelConfig: every field the layers read, parsed once from a checkpoint's config.json (and
// generation_config.json when present), with the per-model-type predicates next to it.
//
// Semantics follow HuggingFace transformers 5.x (the numerics oracle): each field defaults as
// the configuration_<type>.py class does and is interpreted as modeling_<type>.py uses it.
// One deliberate difference: sizes that decide tensor shapes (hidden_size, vocab_size, layer
// and head counts, MoE / MLA / linear-attention widths) are required. HF's class defaults
// describe some 7B-class model; adopting them silently would only surface later as a confusing
// shape mismatch at weight load.
//
// For vision-language checkpoints (qwen3_5, qwen3_5_moe) the text model nested under
// "text_config" is parsed; the vision tower's JSON is kept raw for vision/.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace metrale {

// What mixes tokens in one decoder layer.
enum class LayerKind : uint8_t {
  kFullAttention,     // causal softmax attention over the whole sequence
  kSlidingAttention,  // softmax attention limited to the last `sliding_window` positions
  kLinearAttention,   // gated delta net (Qwen3-Next / Qwen3.5): recurrent + conv state
};
std::string_view layer_kind_name(LayerKind kind);  // "full_attention", ... (HF spelling)

// Supported rope_type values. Anything else (dynamic, longrope, ...) is rejected at parse time
// with the name of the type, so an unsupported checkpoint fails before the first token.
enum class RopeType : uint8_t { kDefault, kLinear, kLlama3, kYarn };
std::string_view rope_type_name(RopeType type);  // "default", "linear", "llama3", "yarn"

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;  // rope_theta (HF default_theta when absent)
  double partial_rotary_factor = 1.0;
  int64_t rotary_dim = 0;  // int(head_dim * partial_rotary_factor); MLA: qk_rope_head_dim
  double factor = 1.0;     // linear / llama3 / yarn scaling factor
  // llama3 and yarn: the pre-extension context length; HF fills max_position_embeddings when
  // absent.
  int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 0.0;          // llama3
  double high_freq_factor = 0.0;         // llama3
  double beta_fast = 32.0;               // yarn
  double beta_slow = 1.0;                // yarn
  std::optional<double> mscale;          // yarn (DeepSeek)
  std::optional<double> mscale_all_dim;  // yarn (DeepSeek)
  bool truncate = true;                  // yarn: floor/ceil the correction range
  // yarn: cos/sin are multiplied by this; the explicit attention_factor, else HF's derivation
  // from factor / mscale / mscale_all_dim. 1 for every other type.
  double attention_factor = 1.0;
  // Qwen3.5 multimodal rope: rotary frequency slots per (t, h, w) axis, interleaved t,h,w,t,...
  // Empty for plain 1-D rope.
  std::vector<int64_t> mrope_section;
  bool mrope_interleaved = false;
  // DeepSeek-V3 rope_interleave, GLM-4V's rotate_half_llm: rotate adjacent pairs (2i, 2i+1)
  // rather than the two halves.
  bool pairs_interleaved = false;
};

// Mixture-of-experts routing and widths. n_experts == 0 means a dense model.
enum class MoeScoring : uint8_t { kSoftmax, kSigmoid };

struct MoeConfig {
  int64_t n_experts = 0;  // num_experts / n_routed_experts
  int64_t n_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;  // width of one routed expert
  // Qwen3-Next / Qwen3.5-MoE: one shared expert of this width, scaled by
  // sigmoid(shared_expert_gate).
  int64_t shared_expert_intermediate_size = 0;
  // DeepSeek-V3 / GLM-4.5: shared MLP of width n_shared_experts * moe_intermediate_size, ungated.
  int64_t n_shared_experts = 0;
  bool norm_topk_prob = false;         // renormalise the top-k weights to sum to 1
  double routed_scaling_factor = 1.0;  // multiplies the routed weights (after renormalising)
  int64_t n_group = 1;                 // group-limited routing: groups of experts ...
  int64_t topk_group = 1;              // ... of which this many are kept
  MoeScoring scoring = MoeScoring::kSoftmax;
  bool has_e_score_correction_bias = false;  // sigmoid routers: bias added for selection only
  bool has_shared_expert_gate = false;
  // Which layers are MoE (the rest use the dense MLP of width intermediate_size):
  int64_t first_k_dense_replace = 0;     // DeepSeek / GLM: layers [0, k) dense
  int64_t decoder_sparse_step = 1;       // Qwen: MoE when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and i is not listed here
};

// Multi-head latent attention (DeepSeek-V3). kv_lora_rank == 0 means not MLA.
struct MlaConfig {
  std::optional<int64_t> q_lora_rank;  // nullopt: q_proj is one full-rank matrix
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // q_a_layernorm / kv_a_layernorm are built without eps in HF, so they use the RMSNorm
  // default 1e-6, not rms_norm_eps.
  double latent_norm_eps = 1e-6;
};

// Gated delta net (linear attention) widths. n_key_heads == 0 means no linear layers.
struct LinearAttentionConfig {
  int64_t n_key_heads = 0;      // linear_num_key_heads
  int64_t n_value_heads = 0;    // linear_num_value_heads
  int64_t key_head_dim = 0;     // linear_key_head_dim
  int64_t value_head_dim = 0;   // linear_value_head_dim
  int64_t conv_kernel_dim = 0;  // linear_conv_kernel_dim
};

struct ModelConfig {
  std::string source;           // the config.json path, for messages
  std::string model_type;       // top-level model_type: what the predicates key on
  std::string text_model_type;  // text_config.model_type when nested, else == model_type

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  // Per-head width of q/k/v. For MLA this mirrors HF's config.head_dim (== qk_rope_head_dim);
  // the attention widths are then in `mla`.
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;  // dense MLP width; 0 when every layer is MoE (qwen3_5_moe)
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";

  bool attention_qkv_bias = false;     // q/k/v projections carry a bias
  bool attention_out_bias = false;     // o_proj carries a bias
  bool mlp_bias = false;               // llama's mlp_bias
  bool qk_norm = false;                // per-head RMSNorm on q and k before rope
  bool attention_output_gate = false;  // q_proj emits [q, gate]; out *= sigmoid(gate)
  double attention_scale = 0.0;        // softmax scale, as HF's attention module computes it

  std::optional<DType> dtype;  // dtype / torch_dtype, when given
  std::string dtype_name;      // its spelling in the file ("bfloat16")
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json's, then generation_config.json's, deduped

  std::optional<int64_t> sliding_window;  // set when some layer is kSlidingAttention
  std::vector<LayerKind> layer_kinds;     // one per layer
  RopeConfig rope;
  LinearAttentionConfig linear;
  MoeConfig moe;
  MlaConfig mla;
  int64_t n_mtp_layers = 0;  // num_nextn_predict_layers / mtp_num_hidden_layers (0: none)

  std::string quantization_config_json;  // raw JSON text; empty when absent
  std::string vision_config_json;        // raw JSON text; empty when absent

  LayerKind layer_kind(int64_t layer) const;
  // Decoder layers [0, n_layers), and the MTP layers numbered after them
  // [n_layers, n_layers + n_mtp_layers).
  bool is_moe_layer(int64_t layer) const;
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  bool has_linear_attention() const { return linear.n_key_heads > 0; }
};

// Parses config.json text. `source` names the file in messages. `generation_config_json`, when
// given, is generation_config.json's text: its eos_token_id (int or list) is merged into
// eos_token_ids and its bos/pad fill ids config.json lacks.
ModelConfig parse_model_config(
    std::string_view config_json, std::string_view source,
    std::optional<std::string_view> generation_config_json = std::nullopt,
    std::string_view generation_source = "generation_config.json");

// Reads dir/config.json and, when present, dir/generation_config.json.
ModelConfig load_model_config(const std::string& dir);

// A short multi-line human summary (used by `metrale inspect`).
std::string describe(const ModelConfig& config);

// --- per-model-type predicates (model_predicates.cc); unknown type -> Error ---

// The model types this parser understands.
const std::vector<std::string_view>& supported_model_types();
bool is_supported_model_type(std::string_view model_type);

// True when the decoder's RMSNorm weights are plain multipliers (y = x / rms * w); false when
// they are offsets from one (y = x / rms * (1 + w)), as Qwen3-Next's zero-centred norms.
bool model_type_ships_vanilla_norm_weights(std::string_view model_type);
bool ships_vanilla_norm_weights(const ModelConfig& config);

// True when HF's forward for this type cannot continue a prefill from the cache a previous
// chunk left, so a prompt must be prefilled in one piece to match it. See the .cc for the
// reading of each modeling file.
bool requires_single_chunk_prefill(std::string_view model_type, int64_t kv_lora_rank);
bool requires_single_chunk_prefill(const ModelConfig& config);

}  // namespace metrale
