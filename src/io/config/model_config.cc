// parse_model_config(): the fields every model type shares, then the family blocks
// (parse_parts.h), then cross-field checks. load_model_config() adds the file reading.
#include "io/config/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/config/parse_parts.h"
#include "io/json/json_parse.h"

namespace metrale {

using config_detail::ModelTypeTraits;
using nlohmann::json;

std::string_view layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention:
      return "full_attention";
    case LayerKind::kSlidingAttention:
      return "sliding_attention";
    case LayerKind::kLinearAttention:
      return "linear_attention";
  }
  return "?";
}

std::string_view rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

LayerKind ModelConfig::layer_kind(int64_t layer) const {
  METRALE_CHECK(layer >= 0 && layer < static_cast<int64_t>(layer_kinds.size()), source, ": layer ",
                layer, " is out of range [0, ", layer_kinds.size(), ")");
  return layer_kinds[static_cast<size_t>(layer)];
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  // The MTP layers DeepSeek-V3 / GLM-4.5 number after the decoder stack follow the same rule
  // (vLLM builds each as a decoder layer of its index).
  METRALE_CHECK(layer >= 0 && layer < n_layers + n_mtp_layers, source, ": layer ", layer,
                " is out of range [0, ", n_layers + n_mtp_layers, ")");
  if (moe.n_experts == 0 || layer < moe.first_k_dense_replace) return false;
  if ((layer + 1) % moe.decoder_sparse_step != 0) return false;
  return std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), layer) ==
         moe.mlp_only_layers.end();
}

namespace {

std::optional<DType> dtype_from_hf_name(const JsonFields& f, const char* key,
                                        const std::string& name) {
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16" || name == "half") return DType::kF16;
  if (name == "float32" || name == "float") return DType::kF32;
  throw f.error(key, "expected one of \"bfloat16\", \"float16\", \"float32\", found \"", name,
                "\"");
}

// dtype (transformers 5) or torch_dtype (4.x), from the text model first, then the outer config.
void parse_dtype(const JsonFields& text, const JsonFields& top, ModelConfig& config) {
  for (const JsonFields* f : {&text, &top}) {
    for (const char* key : {"dtype", "torch_dtype"}) {
      if (std::optional<std::string> name = f->opt_string(key)) {
        config.dtype_name = *name;
        config.dtype = dtype_from_hf_name(*f, key, *name);
        return;
      }
    }
  }
}

void check_token_id(const JsonFields& f, const char* key, int64_t id, int64_t vocab_size) {
  if (id < 0 || id >= vocab_size) {
    throw f.error(key, "expected a token id in [0, vocab_size ", vocab_size, "), found ", id);
  }
}

void parse_token_ids(const JsonFields& text, const JsonFields& top, const ModelTypeTraits& traits,
                     ModelConfig& config) {
  const JsonFields& bos_src = text.has("bos_token_id") ? text : top;
  config.bos_token_id =
      bos_src.has("bos_token_id") ? bos_src.opt_int("bos_token_id") : traits.bos_default;
  const JsonFields& pad_src = text.has("pad_token_id") ? text : top;
  config.pad_token_id = pad_src.opt_int("pad_token_id");
  const JsonFields& eos_src = text.has("eos_token_id") ? text : top;
  config.eos_token_ids = eos_src.int_or_int_list("eos_token_id");
  if (!eos_src.has("eos_token_id") && traits.eos_default)
    config.eos_token_ids = {*traits.eos_default};
  if (config.bos_token_id)
    check_token_id(bos_src, "bos_token_id", *config.bos_token_id, config.vocab_size);
  if (config.pad_token_id)
    check_token_id(pad_src, "pad_token_id", *config.pad_token_id, config.vocab_size);
  for (int64_t id : config.eos_token_ids)
    check_token_id(eos_src, "eos_token_id", id, config.vocab_size);
}

void merge_generation_config(std::string_view text, std::string_view source, ModelConfig& config) {
  const json doc = parse_json(text, source);
  const JsonFields gen(doc, std::string(source));
  for (int64_t id : gen.int_or_int_list("eos_token_id")) {
    check_token_id(gen, "eos_token_id", id, config.vocab_size);
    if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) ==
        config.eos_token_ids.end()) {
      config.eos_token_ids.push_back(id);
    }
  }
  if (!config.bos_token_id && gen.has("bos_token_id")) {
    config.bos_token_id = gen.opt_int("bos_token_id");
    check_token_id(gen, "bos_token_id", *config.bos_token_id, config.vocab_size);
  }
  if (!config.pad_token_id && gen.has("pad_token_id")) {
    config.pad_token_id = gen.opt_int("pad_token_id");
    check_token_id(gen, "pad_token_id", *config.pad_token_id, config.vocab_size);
  }
}

int64_t resolve_head_dim(const JsonFields& text, const ModelTypeTraits& traits,
                         const ModelConfig& config) {
  using config_detail::HeadDimDefault;
  if (traits.head_dim_default == HeadDimDefault::kQkRopeHeadDim) {
    return config.mla.qk_rope_head_dim;  // DeepseekV3Config: head_dim = qk_rope_head_dim, always
  }
  if (text.has("head_dim")) return text.req_size("head_dim");
  if (traits.head_dim_default == HeadDimDefault::kFixed) return traits.head_dim_fixed;
  if (config.hidden_size % config.n_heads != 0) {
    throw text.error("hidden_size",
                     "head_dim is absent, so hidden_size must be divisible by num_attention_heads ",
                     config.n_heads, "; found ", config.hidden_size);
  }
  return config.hidden_size / config.n_heads;
}

bool bias_from_rule(config_detail::BiasRule rule, bool attention_bias) {
  switch (rule) {
    case config_detail::BiasRule::kNever:
      return false;
    case config_detail::BiasRule::kAlways:
      return true;
    case config_detail::BiasRule::kConfig:
      return attention_bias;
  }
  return false;
}

void parse_attention(const JsonFields& text, const ModelTypeTraits& traits, ModelConfig& config) {
  config.n_heads = text.req_size("num_attention_heads");
  if (text.has("num_key_value_heads") || !traits.kv_heads_default_to_heads) {
    config.n_kv_heads = text.req_size("num_key_value_heads");
  } else {
    config.n_kv_heads = config.n_heads;
  }
  if (config.n_heads % config.n_kv_heads != 0) {
    throw text.error("num_key_value_heads", "num_attention_heads ", config.n_heads,
                     " must be a multiple of it; found ", config.n_kv_heads);
  }
  if (traits.head_dim_default == config_detail::HeadDimDefault::kQkRopeHeadDim) {
    config_detail::parse_mla(text, config);
  }
  config.head_dim = resolve_head_dim(text, traits, config);

  // Glm4vMoeTextConfig.attention_bias defaults to true.
  bool attention_bias = text.bool_or("attention_bias", traits.model_type == "glm4v_moe");
  config.attention_qkv_bias = bias_from_rule(traits.qkv_bias, attention_bias);
  config.attention_out_bias = bias_from_rule(traits.out_bias, attention_bias);
  config.mlp_bias = traits.has_mlp_bias_field && text.bool_or("mlp_bias", false);
  config.qk_norm =
      traits.model_type == "glm4_moe" ? text.bool_or("use_qk_norm", false) : traits.qk_norm;
  config.attention_output_gate = traits.output_gate;
  if (std::optional<bool> gate = text.opt_bool("attn_output_gate");
      gate && *gate != traits.output_gate) {
    throw text.error("attn_output_gate", "expected ", traits.output_gate ? "true" : "false", " (",
                     traits.modeling_class, "'s attention ",
                     traits.output_gate ? "always" : "never", " gates its output), found ",
                     *gate ? "true" : "false");
  }
}

// The softmax scale HF's attention module uses.
double attention_scale(const ModelConfig& c) {
  if (!c.is_mla()) return 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  // DeepseekV3Attention: qk_head_dim ** -0.5, then yarn_apply_mscale(): times mscale^2 with
  // mscale = yarn_get_mscale(factor, mscale_all_dim) for any non-default rope with a non-zero
  // mscale_all_dim.
  double scale =
      1.0 / std::sqrt(static_cast<double>(c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim));
  double m_all = c.rope.mscale_all_dim.value_or(0.0);
  if (c.rope.type != RopeType::kDefault && m_all != 0.0 && c.rope.factor > 1.0) {
    double m = 0.1 * m_all * std::log(c.rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

}  // namespace

ModelConfig parse_model_config(std::string_view config_json, std::string_view source,
                               std::optional<std::string_view> generation_config_json,
                               std::string_view generation_source) {
  const json doc = parse_json(config_json, source);
  const JsonFields top(doc, std::string(source));
  ModelConfig config;
  config.source = source;

  const std::string model_type = top.req_string("model_type");
  const ModelTypeTraits* traits_ptr = config_detail::find_model_type(model_type);
  if (traits_ptr == nullptr) {
    std::string supported;
    for (std::string_view t : supported_model_types())
      supported += (supported.empty() ? "" : ", ") + std::string(t);
    throw top.error("model_type", "unsupported model_type \"", model_type,
                    "\" (supported: ", supported, ")");
  }
  const ModelTypeTraits& traits = *traits_ptr;
  config.model_type = model_type;
  config.text_model_type = model_type;

  std::optional<JsonFields> nested;
  if (traits.nested_text_config) {
    nested = top.opt_object("text_config");
    // Qwen2VLConfig still reads a pre-v5 checkpoint's flat config (the text fields at the top).
    if (!nested && model_type != "qwen2_vl" && model_type != "qwen2_5_vl")
      throw top.missing("text_config", "an object, for model_type \"" + model_type + "\"");
    if (nested) {
      std::string want = model_type + "_text";
      config.text_model_type = nested->opt_string("model_type").value_or(want);
      if (config.text_model_type != want) {
        throw nested->error("model_type", "expected \"", want, "\", found \"",
                            config.text_model_type, "\"");
      }
    }
    if (std::optional<JsonFields> vision = top.opt_object("vision_config")) {
      config.vision_config_json = vision->object().dump();
    }
  }
  const JsonFields& text = nested ? *nested : top;

  config.vocab_size = text.req_size("vocab_size");
  config.hidden_size = text.req_size("hidden_size");
  config.n_layers = text.req_size("num_hidden_layers");
  constexpr int64_t kMaxLayers = 1 << 16;  // per-layer tables are allocated from this
  if (config.n_layers > kMaxLayers) {
    throw text.error("num_hidden_layers", "expected at most ", kMaxLayers, ", found ",
                     config.n_layers);
  }
  parse_attention(text, traits, config);
  config.rms_norm_eps = text.positive_number_or("rms_norm_eps", traits.rms_norm_eps_default);
  config.max_position_embeddings =
      text.int_at_least("max_position_embeddings", traits.max_position_default, 1);
  // Qwen3_5ForConditionalGeneration ties by the outer config (class default False).
  config.tie_word_embeddings = top.bool_or("tie_word_embeddings", false);
  if (!nested) config.tie_word_embeddings = text.bool_or("tie_word_embeddings", false);
  config.hidden_act = text.opt_string("hidden_act").value_or("silu");
  if (config.hidden_act != "silu") {
    throw text.error("hidden_act", "expected \"silu\" (the only activation ", traits.modeling_class,
                     " checkpoints use here), found \"", config.hidden_act, "\"");
  }
  parse_dtype(text, top, config);
  parse_token_ids(text, top, traits, config);

  config.rope =
      config_detail::parse_rope(text, traits, config.head_dim, config.max_position_embeddings);
  config_detail::parse_layer_kinds(text, traits, config);
  if (traits.family == config_detail::Family::kQwenHybrid)
    config_detail::parse_linear_attention(text, config);
  // DeepseekV3Config / Glm4MoeConfig: num_mtp_layers (alias num_nextn_predict_layers) defaults
  // to 1; Qwen3.5 spells it mtp_num_hidden_layers. HF's modeling code itself drops MTP weights.
  // Read before the MoE fields: first_k_dense_replace may reach past the stack into them.
  // Glm4vMoeForConditionalGeneration builds no MTP layer whatever num_nextn_predict_layers says
  // (models/glm4v.cc leaves a published one unloaded).
  const bool glm4v_moe = traits.model_type == "glm4v_moe";
  config.n_mtp_layers = traits.family == config_detail::Family::kDeepseekMoe && !glm4v_moe ? 1 : 0;
  for (const char* key : {"num_nextn_predict_layers", "mtp_num_hidden_layers"}) {
    if (text.has(key) && !glm4v_moe) config.n_mtp_layers = text.int_at_least(key, 0, 0);
  }
  config_detail::parse_moe(text, traits, config);

  bool any_dense_layer = false;  // the MTP layers' FFNs follow the same rule at their index
  for (int64_t i = 0; i < config.n_layers + config.n_mtp_layers && !any_dense_layer; ++i)
    any_dense_layer = !config.is_moe_layer(i);
  if (any_dense_layer) {
    config.intermediate_size = text.req_size("intermediate_size");
  } else if (!traits.model_type.starts_with("qwen3_5_moe") && text.has("intermediate_size")) {
    config.intermediate_size = text.req_size("intermediate_size");  // unused, but validated
  }

  if (std::optional<JsonFields> q = top.opt_object("quantization_config")) {
    config.quantization_config_json = q->object().dump();
  }
  config.attention_scale = attention_scale(config);

  if (generation_config_json)
    merge_generation_config(*generation_config_json, generation_source, config);
  return config;
}

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw make_error(path.string(), ": cannot open for reading");
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) throw make_error(path.string(), ": read failed");
  return out.str();
}

}  // namespace

ModelConfig load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path config_path = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config_path, ec)) {
    throw make_error(config_path.string(),
                     ": not found (expected a checkpoint directory holding config.json)");
  }
  std::string config_text = read_file(config_path);
  fs::path gen_path = fs::path(dir) / "generation_config.json";
  if (fs::is_regular_file(gen_path, ec)) {
    std::string gen_text = read_file(gen_path);
    return parse_model_config(config_text, config_path.string(), gen_text, gen_path.string());
  }
  return parse_model_config(config_text, config_path.string());
}

}  // namespace metrale
