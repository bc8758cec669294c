#pragma once
// VisionConfig: a vision-language checkpoint's vision tower, from config.json's vision_config
// (and the media token ids beside it), as transformers 5.24's Qwen2VLVisionConfig,
// Qwen2_5_VLVisionConfig, Qwen3VLVisionConfig (and _moe), Qwen3_5VisionConfig (and _moe) and
// Glm4vVisionConfig read it. As ModelConfig does, sizes that decide tensor shapes are required
// (HF's class defaults describe a 7B model); constants of the architecture (in_channels 3, temporal
// patch 2, merge 2, the rope theta, the activation) take HF's defaults. Cross-field checks:
// head_dim = width / num_heads divisible by 4 (the 2-D rotary splits half of it between h and w),
// the merger's output equal to the language model's hidden_size, block indexes inside the depth,
// media token ids inside the vocabulary.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace metrale {

enum class VisionTowerKind : uint8_t {
  kQwen2Vl,    // qwen2_vl: LayerNorm blocks, fused qkv, fc1 / act / fc2 MLP (mlp_ratio)
  kQwen2_5Vl,  // qwen2_5_vl: RMSNorm blocks, SwiGLU MLP, window attention
  kQwen3Vl,    // qwen3_vl, qwen3_vl_moe: learned position embeddings, deepstack mergers
  kQwen3_5,    // qwen3_5, qwen3_5_moe: qwen3_vl's tower without deepstack
  kGlm4v,  // glm4v, glm4v_moe: RMSNorm blocks, bicubic learned positions, downsample, gated merger
};

struct VisionConfig {
  std::string source;      // "config.json: field 'vision_config'", for messages
  std::string model_type;  // the checkpoint's model_type ("qwen2_vl")
  VisionTowerKind tower = VisionTowerKind::kQwen2Vl;

  int64_t depth = 0;       // blocks
  int64_t width = 0;       // the blocks' width (qwen2_vl: embed_dim; others: hidden_size)
  int64_t n_heads = 0;     // num_heads
  int64_t head_dim = 0;    // width / n_heads
  int64_t mlp_width = 0;   // qwen2_vl: width * mlp_ratio; others: intermediate_size
  int64_t out_width = 0;   // the merger's output (qwen2_vl: hidden_size; others: out_hidden_size)
  std::string hidden_act;  // the blocks' MLP activation (HF spelling)
  int64_t in_channels = 3;
  int64_t patch_size = 0;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  double rope_theta = 10000.0;  // rope_parameters (rope_type "axial")

  // qwen2_5_vl
  int64_t tokens_per_second = 0;
  int64_t window_size = 0;
  std::vector<int64_t> fullatt_block_indexes;
  // qwen3_vl / qwen3_5
  int64_t num_position_embeddings = 0;
  std::vector<int64_t> deepstack_visual_indexes;  // qwen3_vl only
  // glm4v: the blocks' MLP is out_hidden_size wide (mlp_width), the merger's intermediate_size
  // (merger_width); the position table is (image_size / patch_size)^2; RMSNorm eps
  // rms_norm_eps; qkv bias attention_bias.
  int64_t merger_width = 0;
  double norm_eps = 1e-6;
  bool qkv_bias = true;

  // The media tokens (top-level config; glm4v: image_start_token_id / image_end_token_id are
  // the vision start / end).
  int64_t image_token_id = 0;
  int64_t video_token_id = 0;
  int64_t vision_start_token_id = 0;
  int64_t vision_end_token_id = 0;
  // glm4v: <|begin_of_video|> / <|end_of_video|> (video_start_token_id / video_end_token_id);
  // a video's frames are image tokens between them. -1 for the other families.
  int64_t video_start_token_id = -1;
  int64_t video_end_token_id = -1;

  // One patch's values: in_channels * temporal_patch_size * patch_size^2 (pixel_values' width).
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  // Patches merged into one language-model token.
  int64_t merge_rows() const { return spatial_merge_size * spatial_merge_size; }
};

// Whether a config.json model_type has a vision tower this parser reads.
bool has_vision_tower(std::string_view model_type);
// Its tower's kind, without reading the config (nullopt: no tower).
std::optional<VisionTowerKind> vision_tower_kind(std::string_view model_type);

// Parses the vision tower of config.json's text (`source` names the file). Error naming the
// field on a model_type without a tower, a missing or bad field, or a failed cross-check.
VisionConfig parse_vision_config(std::string_view config_json, std::string_view source);

// dir/config.json's vision tower.
VisionConfig load_vision_config(const std::string& dir);

}  // namespace metrale
