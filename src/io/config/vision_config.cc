#include "io/config/vision_config.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "io/json/json_fields.h"
#include "io/json/json_parse.h"

namespace metrale {
namespace {

// One row per checkpoint model_type (transformers 5.24's configuration_<type>.py).
struct TowerTraits {
  std::string_view model_type;
  std::string_view vision_type;  // vision_config.model_type
  VisionTowerKind tower;
  std::string_view act;              // hidden_act's class default
  std::array<int64_t, 4> media_ids;  // image, video, vision_start, vision_end defaults
  bool glm = false;                  // Glm4vConfig's names for vision start / end
};

constexpr std::array<int64_t, 4> kQwenIds = {151655, 151656, 151652, 151653};
constexpr std::array<int64_t, 4> kQwen35Ids = {248056, 248057, 248053, 248054};
constexpr std::array<int64_t, 4> kGlm4vIds = {151343, 151344, 151339, 151340};
constexpr std::array<int64_t, 4> kGlm4vMoeIds = {151363, 151364, 151339, 151340};

constexpr TowerTraits kTowers[] = {
    {"qwen2_vl", "qwen2_vl_vision", VisionTowerKind::kQwen2Vl, "quick_gelu", kQwenIds},
    {"qwen2_5_vl", "qwen2_5_vl_vision", VisionTowerKind::kQwen2_5Vl, "silu", kQwenIds},
    {"qwen3_vl", "qwen3_vl_vision", VisionTowerKind::kQwen3Vl, "gelu_pytorch_tanh", kQwenIds},
    {"qwen3_vl_moe", "qwen3_vl_moe_vision", VisionTowerKind::kQwen3Vl, "gelu_pytorch_tanh",
     kQwenIds},
    {"qwen3_5", "qwen3_5_vision", VisionTowerKind::kQwen3_5, "gelu_pytorch_tanh", kQwen35Ids},
    {"qwen3_5_moe", "qwen3_5_moe_vision", VisionTowerKind::kQwen3_5, "gelu_pytorch_tanh",
     kQwen35Ids},
    {"glm4v", "glm4v_vision", VisionTowerKind::kGlm4v, "silu", kGlm4vIds, true},
    {"glm4v_moe", "glm4v_moe_vision", VisionTowerKind::kGlm4v, "silu", kGlm4vMoeIds, true},
};

const TowerTraits* find_tower(std::string_view model_type) {
  for (const TowerTraits& t : kTowers)
    if (t.model_type == model_type) return &t;
  return nullptr;
}

// Block indexes (fullatt_block_indexes, deepstack_visual_indexes): inside the depth, ascending.
std::vector<int64_t> block_indexes(const JsonFields& v, const char* key,
                                   std::vector<int64_t> fallback, int64_t depth) {
  std::vector<int64_t> out = v.opt_int_list(key, 0).value_or(std::move(fallback));
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] >= depth) {
      throw v.error(key, "entry ", out[i], " names a block past the tower's depth ", depth);
    }
    if (i > 0 && out[i] <= out[i - 1])
      throw v.error(key, "expected ascending block indexes, found ", out[i - 1], " then ", out[i]);
  }
  return out;
}

}  // namespace

bool has_vision_tower(std::string_view model_type) { return find_tower(model_type) != nullptr; }

std::optional<VisionTowerKind> vision_tower_kind(std::string_view model_type) {
  const TowerTraits* t = find_tower(model_type);
  if (t == nullptr) return std::nullopt;
  return t->tower;
}

VisionConfig parse_vision_config(std::string_view config_json, std::string_view source) {
  const nlohmann::json doc = parse_json(config_json, source);
  const JsonFields top(doc, std::string(source));
  const std::string model_type = top.req_string("model_type");
  const TowerTraits* traits = find_tower(model_type);
  if (traits == nullptr) {
    throw top.error("model_type", "\"", model_type,
                    "\" has no vision tower metrale reads (expected qwen2_vl, qwen2_5_vl, "
                    "qwen3_vl, qwen3_vl_moe, qwen3_5, qwen3_5_moe, glm4v or glm4v_moe)");
  }
  const std::optional<JsonFields> vision = top.opt_object("vision_config");
  if (!vision)
    throw top.missing("vision_config", "an object, for model_type \"" + model_type + "\"");
  const JsonFields& v = *vision;
  VisionConfig c;
  c.source = v.where();
  c.model_type = model_type;
  c.tower = traits->tower;
  // Published checkpoints also spell the vision model_type as the outer one (Qwen2-VL's, which
  // Qwen2VLConfig renames; Qwen3.5's): the sub-config class is chosen by the outer type.
  const std::string vision_type =
      v.opt_string("model_type").value_or(std::string(traits->vision_type));
  if (vision_type != traits->vision_type && vision_type != model_type) {
    throw v.error("model_type", "expected \"", traits->vision_type, "\" (or \"", model_type,
                  "\"), found \"", vision_type, "\"");
  }

  c.depth = v.req_size("depth");
  c.n_heads = v.req_size("num_heads");
  if (c.tower == VisionTowerKind::kQwen2Vl) {
    c.width = v.req_size("embed_dim");
    c.mlp_width = c.width * v.req_size("mlp_ratio");
    c.out_width = v.req_size("hidden_size");
  } else if (c.tower == VisionTowerKind::kGlm4v) {
    // Glm4vVisionModel: Glm4VisionMlp(intermediate = out_hidden_size) in the blocks, the
    // merger's context_dim = intermediate_size.
    c.width = v.req_size("hidden_size");
    c.out_width = v.req_size("out_hidden_size");
    c.mlp_width = c.out_width;
    c.merger_width = v.req_size("intermediate_size");
    c.norm_eps = v.positive_number_or("rms_norm_eps", 1e-5);
    c.qkv_bias = v.bool_or("attention_bias", false);
  } else {
    c.width = v.req_size("hidden_size");
    c.mlp_width = v.req_size("intermediate_size");
    c.out_width = v.req_size("out_hidden_size");
  }
  if (c.width % c.n_heads != 0 || c.width / c.n_heads % 4 != 0) {
    throw v.error("num_heads", "the width ", c.width, " over ", c.n_heads,
                  " heads must give a head_dim divisible by 4 (the 2-D rotary)");
  }
  c.head_dim = c.width / c.n_heads;
  c.hidden_act = v.opt_string("hidden_act").value_or(std::string(traits->act));
  constexpr std::array<std::string_view, 4> kActs = {"silu", "gelu", "gelu_pytorch_tanh",
                                                     "quick_gelu"};
  if (std::find(kActs.begin(), kActs.end(), c.hidden_act) == kActs.end()) {
    throw v.error("hidden_act",
                  "expected \"silu\", \"gelu\", \"gelu_pytorch_tanh\" or \"quick_gelu\", found \"",
                  c.hidden_act, "\"");
  }
  if (c.tower == VisionTowerKind::kQwen2_5Vl && c.hidden_act != "silu") {
    // Qwen2_5_VLMLP is gated (act(gate) * up): only silu is a gate its checkpoints ship.
    throw v.error("hidden_act", "expected \"silu\" (Qwen2.5-VL's gated MLP), found \"",
                  c.hidden_act, "\"");
  }
  c.in_channels = v.int_at_least("in_channels", 3, 1);
  c.patch_size = v.req_size("patch_size");
  c.temporal_patch_size = v.int_at_least("temporal_patch_size", 2, 1);
  c.spatial_merge_size = v.int_at_least("spatial_merge_size", 2, 1);
  if (c.patch_dim() > (int64_t{1} << 24) || c.spatial_merge_size > 64) {
    throw v.error("patch_size", "a patch of ", c.in_channels, " x ", c.temporal_patch_size, " x ",
                  c.patch_size, "^2 values (merge ", c.spatial_merge_size, ") is too large");
  }
  if (std::optional<JsonFields> rope = v.opt_object("rope_parameters")) {
    const std::string type = rope->opt_string("rope_type").value_or("axial");
    if (type != "axial")
      throw rope->error("rope_type", "expected \"axial\" (the tower's 2-D rotary), found \"", type,
                        "\"");
    c.rope_theta = rope->positive_number_or("rope_theta", 10000.0);
  }

  if (c.tower == VisionTowerKind::kQwen2_5Vl) {
    c.tokens_per_second = v.int_at_least("tokens_per_second", 4, 0);
    c.window_size = v.int_at_least("window_size", 112, 1);
    c.fullatt_block_indexes = block_indexes(v, "fullatt_block_indexes", {7, 15, 23, 31}, c.depth);
    // Qwen2_5_VisionTransformer: window_size // spatial_merge_size // patch_size merged patches.
    const int64_t merged_patch = c.spatial_merge_size * c.patch_size;
    if (c.window_size < merged_patch) {
      throw v.error("window_size",
                    "expected at least spatial_merge_size x patch_size = ", merged_patch,
                    " (one merged patch), found ", c.window_size);
    }
  }
  if (c.tower == VisionTowerKind::kQwen3Vl || c.tower == VisionTowerKind::kQwen3_5) {
    c.num_position_embeddings = v.req_size("num_position_embeddings");
    int64_t side = 1;
    while (side * side < c.num_position_embeddings) ++side;
    if (side * side != c.num_position_embeddings) {
      throw v.error("num_position_embeddings", "expected a square (a side x side grid), found ",
                    c.num_position_embeddings);
    }
  }
  if (c.tower == VisionTowerKind::kGlm4v) {
    // Glm4vVisionEmbeddings: an (image_size // patch_size)^2 table.
    const int64_t image_size = v.req_size("image_size");
    const int64_t side = image_size / c.patch_size;
    if (side < 1) {
      throw v.error("image_size", "expected at least patch_size ", c.patch_size, ", found ",
                    image_size);
    }
    c.num_position_embeddings = side * side;
  }
  if (c.tower == VisionTowerKind::kQwen3Vl)
    c.deepstack_visual_indexes = block_indexes(v, "deepstack_visual_indexes", {8, 16, 24}, c.depth);
  // Qwen3.5's configs carry an empty list (its tower has no deepstack mergers).
  if (c.tower == VisionTowerKind::kQwen3_5 &&
      !v.opt_int_list("deepstack_visual_indexes", 0).value_or(std::vector<int64_t>{}).empty()) {
    throw v.error("deepstack_visual_indexes", "expected none: ", model_type,
                  "'s tower has no deepstack mergers");
  }

  // The merger feeds the language model: its output is the LM's input width.
  const std::optional<JsonFields> nested = top.opt_object("text_config");
  const JsonFields& text = nested ? *nested : top;  // old Qwen2-VL configs are flat
  const int64_t lm_hidden = text.req_size("hidden_size");
  if (c.out_width != lm_hidden) {
    throw v.error(c.tower == VisionTowerKind::kQwen2Vl ? "hidden_size" : "out_hidden_size",
                  "the merger's output ", c.out_width,
                  " must equal the language model's hidden_size ", lm_hidden);
  }
  const int64_t vocab = text.req_size("vocab_size");
  const char* id_keys[] = {"image_token_id", "video_token_id",
                           traits->glm ? "image_start_token_id" : "vision_start_token_id",
                           traits->glm ? "image_end_token_id" : "vision_end_token_id"};
  int64_t* ids[] = {&c.image_token_id, &c.video_token_id, &c.vision_start_token_id,
                    &c.vision_end_token_id};
  for (size_t i = 0; i < 4; ++i) {
    *ids[i] = top.int_or(id_keys[i], traits->media_ids[i]);
    if (*ids[i] < 0 || *ids[i] >= vocab) {
      throw top.error(id_keys[i], "expected a token id in [0, vocab_size ", vocab, "), found ",
                      *ids[i], top.has(id_keys[i]) ? "" : " (transformers' default)");
    }
  }
  if (c.image_token_id == c.video_token_id)
    throw top.error("video_token_id", "equals image_token_id ", c.image_token_id);
  if (traits->glm) {
    // Glm4vConfig's defaults (the GLM-4.1V tokenizer's <|begin_of_video|> / <|end_of_video|>).
    const std::pair<const char*, int64_t*> video_ids[] = {
        {"video_start_token_id", &c.video_start_token_id},
        {"video_end_token_id", &c.video_end_token_id}};
    const int64_t defaults[] = {151341, 151342};
    for (size_t i = 0; i < 2; ++i) {
      const auto& [key, id] = video_ids[i];
      *id = top.int_or(key, defaults[i]);
      if (*id < 0 || *id >= vocab) {
        throw top.error(key, "expected a token id in [0, vocab_size ", vocab, "), found ", *id,
                        top.has(key) ? "" : " (transformers' default)");
      }
    }
  }
  return c;
}

VisionConfig load_vision_config(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir) / "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw make_error(path.string(), ": cannot open for reading");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_vision_config(text.str(), path.string());
}

}  // namespace metrale
