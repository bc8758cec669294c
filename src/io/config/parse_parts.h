#pragma once
// The pieces parse_model_config() is assembled from; internal to io/config.
#include <cstdint>

#include "io/config/model_config.h"
#include "io/config/model_types.h"
#include "io/json/json_fields.h"

namespace metrale::config_detail {

// rope_theta / rope_scaling (transformers 4.x layout) or rope_parameters (5.x layout), plus
// partial_rotary_factor, normalised as RotaryEmbeddingConfigMixin.convert_rope_params_to_dict
// and standardize_rope_params do. Needs head_dim and max_position_embeddings already set.
RopeConfig parse_rope(const JsonFields& text, const ModelTypeTraits& traits, int64_t head_dim,
                      int64_t max_position_embeddings);

// layer_types / full_attention_interval / sliding-window rules -> one kind per layer; also
// sets config.sliding_window.
void parse_layer_kinds(const JsonFields& text, const ModelTypeTraits& traits, ModelConfig& config);

void parse_moe(const JsonFields& text, const ModelTypeTraits& traits, ModelConfig& config);
void parse_mla(const JsonFields& text, ModelConfig& config);
void parse_linear_attention(const JsonFields& text, ModelConfig& config);

}  // namespace metrale::config_detail
