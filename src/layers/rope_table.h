#pragma once
// RoPE cos/sin tables, computed once per model exactly as HuggingFace computes them:
// inv_freq in float32 by the same formula and operation order as transformers'
// modeling_rope_utils (default, linear, llama3, yarn), freqs = float(pos) * inv_freq in
// float32, then cos/sin times the attention scaling. Only half of each row is stored,
// because HF's emb = cat(freqs, freqs) repeats it.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"         // RopeCache
#include "io/config/model_config.h"  // RopeType, ModelConfig

namespace metrale {

// The fields of config.json's rope_parameters (or legacy rope_scaling) that the tables
// need. Optional HF fields carry HF's defaults.
struct RopeTableConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;  // rope_theta
  int64_t head_dim = 0;
  double partial_rotary_factor = 1.0;  // rotary_dim = int(head_dim * factor)
  double factor = 1.0;                 // linear, llama3, yarn
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;  // llama3, yarn
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 0.0;  // <= 0: derived from factor / mscale as HF does
  double mscale = 0.0;            // 0: absent
  double mscale_all_dim = 0.0;    // 0: absent
  bool truncate = true;
};

class RopeTable {
 public:
  // Tables for positions [0, max_positions). Throws Error on inconsistent fields
  // (odd rotary_dim, factor <= 0, yarn/llama3 without original_max_position_embeddings ...).
  static RopeTable build(const RopeTableConfig& config, int64_t max_positions);

  int64_t rotary_dim() const { return rotary_dim_; }  // rotated leading part of each head
  int64_t max_positions() const { return max_positions_; }
  float attention_scaling() const { return attention_scaling_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }  // [rotary_dim / 2]
  // Row for one position: rotary_dim / 2 values each.
  const float* cos(int64_t pos) const { return cos_.data() + pos * (rotary_dim_ / 2); }
  const float* sin(int64_t pos) const { return sin_.data() + pos * (rotary_dim_ / 2); }
  // The view the backend's rope op reads.
  RopeCache cache() const { return {cos_.data(), sin_.data(), rotary_dim_, max_positions_}; }

 private:
  int64_t rotary_dim_ = 0;
  int64_t max_positions_ = 0;
  float attention_scaling_ = 1.0f;
  std::vector<float> inv_freq_;
  std::vector<float> cos_;  // [max_positions, rotary_dim / 2]
  std::vector<float> sin_;
};

// Multimodal rope: the axis (0 = t, 1 = h, 2 = w) each of the `half` frequencies follows.
// Sectioned (Qwen2-VL): the first section[0] frequencies follow t, the next section[1] h, the
// rest w. Interleaved (Qwen3-VL, Qwen3.5: transformers' apply_interleaved_mrope): frequency i
// follows h when i % 3 == 1 and i < 3 section[1], w when i % 3 == 2 and i < 3 section[2], else t.
std::vector<int32_t> mrope_axes(std::span<const int64_t> section, bool interleaved, int64_t half);

// RopeTable inputs from a model's config.
RopeTableConfig rope_table_config(const ModelConfig& config);

// The float32 inverse frequencies and attention scaling alone (exposed for tests).
std::vector<float> rope_inv_freq(const RopeTableConfig& config, float* attention_scaling);

}  // namespace metrale
