// Rope parameters in both layouts checkpoints ship:
//   transformers 4.x: top-level rope_theta (+ partial_rotary_factor) and a rope_scaling dict
//                     whose kind is "type" or "rope_type" (DeepSeek-V3 still says "type").
//   transformers 5.x: one rope_parameters dict holding rope_type, rope_theta, factor, ...
// Precedence is HF's (convert_rope_params_to_dict): rope_scaling if it is a non-empty dict,
// else rope_parameters; inside it, its own rope_theta / partial_rotary_factor win over the
// top-level ones, which win over the defaults.
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <utility>

#include "io/config/parse_parts.h"

namespace metrale::config_detail {
namespace {

// HF's yarn get_mscale(): 0.1 * m * ln(scale) + 1, or 1 when not scaling up.
double yarn_get_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

std::optional<JsonFields> rope_dict(const JsonFields& text) {
  // `rope_scaling or rope_parameters`: an empty rope_scaling dict is falsy in Python.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    std::optional<JsonFields> d = text.opt_object(key);
    if (d && !d->object().empty()) return d;
  }
  return std::nullopt;
}

void parse_yarn(const JsonFields& d, int64_t max_position_embeddings, RopeConfig& rope) {
  std::optional<double> factor = d.opt_number("factor");
  rope.factor = factor ? *factor
                       : static_cast<double>(max_position_embeddings) /
                             static_cast<double>(rope.original_max_position_embeddings);
  if (!(rope.factor > 0)) throw d.error("factor", "expected a number > 0, found ", rope.factor);
  // `get("beta_fast") or 32`: HF treats 0 like absent.
  double beta_fast = d.number_or("beta_fast", 0.0);
  double beta_slow = d.number_or("beta_slow", 0.0);
  rope.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
  rope.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
  rope.mscale = d.opt_number("mscale");
  rope.mscale_all_dim = d.opt_number("mscale_all_dim");
  rope.truncate = d.bool_or("truncate", true);
  if (std::optional<double> af = d.opt_number("attention_factor")) {
    if (*af < 0) throw d.error("attention_factor", "expected a number >= 0, found ", *af);
    rope.attention_factor = *af;
  } else if (rope.mscale.value_or(0.0) != 0.0 && rope.mscale_all_dim.value_or(0.0) != 0.0) {
    rope.attention_factor = yarn_get_mscale(rope.factor, *rope.mscale) /
                            yarn_get_mscale(rope.factor, *rope.mscale_all_dim);
  } else {
    rope.attention_factor = yarn_get_mscale(rope.factor, 1.0);
  }
}

void parse_mrope(const JsonFields& d, const ModelTypeTraits& traits, RopeConfig& rope) {
  // Qwen3_5TextRotaryEmbedding: mrope_section defaults to [11, 11, 10] (Qwen3VLTextRotaryEmbedding:
  // [24, 20, 20]), and the frequencies are always recomposed interleaved (stride 3) whatever
  // mrope_interleaved says.
  const bool qwen3_vl = traits.model_type == "qwen3_vl" || traits.model_type == "qwen3_vl_moe";
  rope.mrope_section =
      d.opt_int_list("mrope_section", 0)
          .value_or(qwen3_vl ? std::vector<int64_t>{24, 20, 20} : std::vector<int64_t>{11, 11, 10});
  if (rope.mrope_section.size() != 3) {
    throw d.error("mrope_section", "expected 3 entries (t, h, w), found ",
                  rope.mrope_section.size());
  }
  for (int64_t n : rope.mrope_section) {
    if (n > rope.rotary_dim)
      throw d.error("mrope_section", "entry ", n, " exceeds the rotary dim ", rope.rotary_dim);
  }
  int64_t slots = std::accumulate(rope.mrope_section.begin(), rope.mrope_section.end(), int64_t{0});
  if (slots * 2 != rope.rotary_dim) {
    throw d.error("mrope_section", "entries sum to ", slots,
                  " frequency slots, but the rotary dim ", rope.rotary_dim, " has ",
                  rope.rotary_dim / 2);
  }
  // Qwen3-VL's configs may leave mrope_interleaved out or false: its rope ignores the field.
  if (!qwen3_vl && !d.bool_or("mrope_interleaved", true)) {
    throw d.error("mrope_interleaved", "expected true: ", traits.modeling_class,
                  "'s rotary embedding only implements the interleaved layout, found false");
  }
  rope.mrope_interleaved = true;
}

// Qwen2VLRotaryEmbedding: mrope_section defaults to [16, 24, 24] (Glm4vTextRotaryEmbedding:
// [8, 12, 12]); the frequencies are split in sections (t, then h, then w), never interleaved.
void parse_sectioned_mrope(const JsonFields& d, std::vector<int64_t> fallback, RopeConfig& rope) {
  rope.mrope_section = d.opt_int_list("mrope_section", 0).value_or(std::move(fallback));
  if (rope.mrope_section.size() != 3) {
    throw d.error("mrope_section", "expected 3 entries (t, h, w), found ",
                  rope.mrope_section.size());
  }
  const int64_t slots =
      std::accumulate(rope.mrope_section.begin(), rope.mrope_section.end(), int64_t{0});
  if (slots * 2 != rope.rotary_dim) {
    throw d.error("mrope_section", "entries sum to ", slots,
                  " frequency slots, but the rotary dim ", rope.rotary_dim, " has ",
                  rope.rotary_dim / 2);
  }
  rope.mrope_interleaved = false;
}

}  // namespace

RopeConfig parse_rope(const JsonFields& text, const ModelTypeTraits& traits, int64_t head_dim,
                      int64_t max_position_embeddings) {
  RopeConfig rope;
  std::optional<JsonFields> dict = rope_dict(text);
  static const nlohmann::json kEmpty = nlohmann::json::object();
  JsonFields d = dict ? *dict : JsonFields(kEmpty, text.source(), text.path("rope_parameters"));

  for (const char* layer_type : {"full_attention", "sliding_attention", "linear_attention"}) {
    if (d.has(layer_type)) {
      throw d.error(layer_type,
                    "per-layer-type rope parameters are not supported for model_type \"",
                    traits.model_type, "\"");
    }
  }

  rope.theta =
      d.opt_number("rope_theta").value_or(text.number_or("rope_theta", traits.rope_theta_default));
  if (!(rope.theta > 1.0)) {
    throw(d.has("rope_theta") ? d : text)
        .error("rope_theta", "expected a number > 1, found ", rope.theta);
  }
  rope.partial_rotary_factor =
      d.opt_number("partial_rotary_factor")
          .value_or(text.number_or("partial_rotary_factor", traits.partial_rotary_default));
  if (!(rope.partial_rotary_factor > 0.0 && rope.partial_rotary_factor <= 1.0)) {
    throw(d.has("partial_rotary_factor") ? d : text)
        .error("partial_rotary_factor", "expected a number in (0, 1], found ",
               rope.partial_rotary_factor);
  }
  // int(head_dim * partial_rotary_factor), truncating as Python's int() does.
  rope.rotary_dim =
      static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  if (rope.rotary_dim <= 0 || rope.rotary_dim % 2 != 0) {
    throw text.error("partial_rotary_factor", "head_dim ", head_dim, " x partial_rotary_factor ",
                     rope.partial_rotary_factor, " gives rotary dim ", rope.rotary_dim,
                     "; expected a positive even number");
  }

  std::string kind = "default";
  if (std::optional<std::string> s = d.opt_string("rope_type")) {
    kind = *s;
  } else if (std::optional<std::string> t = d.opt_string("type")) {
    kind = *t;
  }
  const char* kind_key = d.has("rope_type") ? "rope_type" : "type";
  // Qwen2VLTextConfig / Qwen2_5_VLTextConfig: a 4.x rope_scaling of type "mrope" is the
  // default rope, sectioned.
  const bool qwen2_vl = traits.model_type == "qwen2_vl" || traits.model_type == "qwen2_5_vl";
  if (kind == "mrope" && qwen2_vl) kind = "default";

  bool scaled = kind == "llama3" || kind == "yarn";
  if (scaled) {
    rope.original_max_position_embeddings =
        d.int_or("original_max_position_embeddings", max_position_embeddings);
    if (rope.original_max_position_embeddings <= 0) {
      throw d.error("original_max_position_embeddings", "expected a positive integer, found ",
                    rope.original_max_position_embeddings);
    }
  }

  if (kind == "default") {
    rope.type = RopeType::kDefault;
  } else if (kind == "linear") {
    rope.type = RopeType::kLinear;
    if (!d.has("factor")) throw d.missing("factor", "a number, for rope type \"linear\"");
    rope.factor = d.positive_number_or("factor", 1.0);
  } else if (kind == "llama3") {
    rope.type = RopeType::kLlama3;
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"}) {
      if (!d.has(key)) {
        throw d.missing(key, "a number, for rope type \"llama3\"");
      }
    }
    rope.factor = d.positive_number_or("factor", 1.0);
    rope.low_freq_factor = d.positive_number_or("low_freq_factor", 1.0);
    rope.high_freq_factor = d.positive_number_or("high_freq_factor", 1.0);
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      throw d.error("high_freq_factor", "expected a value greater than low_freq_factor ",
                    rope.low_freq_factor, ", found ", rope.high_freq_factor);
    }
  } else if (kind == "yarn") {
    rope.type = RopeType::kYarn;
    parse_yarn(d, max_position_embeddings, rope);
  } else {
    throw d.error(kind_key, "rope type \"", kind,
                  "\" is not supported (supported: default, linear, llama3, yarn)");
  }

  if (traits.model_type.starts_with("qwen3_5") || traits.model_type.starts_with("qwen3_vl"))
    parse_mrope(d, traits, rope);
  if (qwen2_vl) parse_sectioned_mrope(d, {16, 24, 24}, rope);
  // Glm4vTextRotaryEmbedding: the sections, then repeat_interleave(2) and rotate_half_llm,
  // which rotates adjacent pairs (2i, 2i + 1) by frequency i.
  if (traits.model_type == "glm4v") {
    parse_sectioned_mrope(d, {8, 12, 12}, rope);
    rope.pairs_interleaved = true;
  }
  // Glm4vMoeTextRotaryEmbedding: the same sections, then cat(freq, freq) and rotate_half.
  if (traits.model_type == "glm4v_moe") parse_sectioned_mrope(d, {8, 12, 12}, rope);
  // DeepseekV3Config.rope_interleave (default True): apply_rotary_pos_emb_interleave.
  if (traits.model_type == "deepseek_v3")
    rope.pairs_interleaved = text.bool_or("rope_interleave", true);
  return rope;
}

}  // namespace metrale::config_detail
