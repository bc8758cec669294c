// vision_config: the committed checkpoints' towers (the tiny qwen2_vl and qwen3_5 fixtures,
// the published Qwen3.5 configs), each family's fields and defaults, and every refusal.
#include "io/config/vision_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config_test_util.h"

namespace metrale {
namespace {

using nlohmann::json;

std::string err(const json& doc) {
  return test::error_of([&] { parse_vision_config(doc.dump(), "c.json"); });
}

TEST(VisionConfig, Qwen2VlFixture) {
  const VisionConfig c = load_vision_config("tests/data/fixtures/qwen2_vl_f32");
  EXPECT_EQ(c.tower, VisionTowerKind::kQwen2Vl);
  EXPECT_EQ(c.depth, 2);
  EXPECT_EQ(c.width, 32);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.mlp_width, 128);  // embed_dim * mlp_ratio
  EXPECT_EQ(c.out_width, 32);
  EXPECT_EQ(c.hidden_act, "quick_gelu");
  EXPECT_EQ(c.patch_dim(), 3 * 2 * 4 * 4);
  EXPECT_EQ(c.merge_rows(), 4);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.image_token_id, 250);
  EXPECT_EQ(c.vision_end_token_id, 253);
  EXPECT_NE(c.source.find("field 'vision_config'"), std::string::npos);
}

TEST(VisionConfig, Qwen35FixtureAndPublishedConfigs) {
  const VisionConfig f = load_vision_config("tests/data/fixtures/qwen3_5_f32");
  EXPECT_EQ(f.tower, VisionTowerKind::kQwen3_5);
  EXPECT_EQ(f.width, 32);
  EXPECT_EQ(f.mlp_width, 64);
  EXPECT_EQ(f.out_width, 64);
  EXPECT_EQ(f.num_position_embeddings, 16);
  EXPECT_EQ(f.image_token_id, 384);
  // The published configs spell vision_config.model_type as the outer type, with an empty
  // deepstack list.
  const VisionConfig q = load_vision_config("tests/data/configs/qwen3_5");
  EXPECT_EQ(q.depth, 12);
  EXPECT_EQ(q.head_dim, 64);
  EXPECT_EQ(q.out_width, 1024);
  EXPECT_EQ(q.image_token_id, 248056);
  const VisionConfig m = load_vision_config("tests/data/configs/qwen3_5_moe");
  EXPECT_EQ(m.tower, VisionTowerKind::kQwen3_5);
  EXPECT_EQ(m.head_dim, 72);
  EXPECT_EQ(m.out_width, 2048);
}

json qwen2_5_vl() {
  // Qwen2.5-VL-7B-Instruct's vision_config (in_chans and spatial_patch_size as it ships them:
  // transformers ignores both), with a small text model beside it.
  return json::parse(R"({"model_type": "qwen2_5_vl", "vocab_size": 152064, "hidden_size": 3584,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
      "intermediate_size": 3420, "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584,
      "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
      "temporal_patch_size": 2}})");
}

json qwen3_vl() {
  return json::parse(R"({"model_type": "qwen3_vl", "image_token_id": 151655,
    "text_config": {"vocab_size": 151936, "hidden_size": 2560},
    "vision_config": {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
      "num_heads": 16, "out_hidden_size": 2560, "patch_size": 16,
      "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17]}})");
}

TEST(VisionConfig, FamiliesAndDefaults) {
  const VisionConfig a = parse_vision_config(qwen2_5_vl().dump(), "c.json");
  EXPECT_EQ(a.tower, VisionTowerKind::kQwen2_5Vl);
  EXPECT_EQ(a.head_dim, 80);
  EXPECT_EQ(a.mlp_width, 3420);
  EXPECT_EQ(a.tokens_per_second, 2);
  EXPECT_EQ(a.window_size, 112);
  EXPECT_EQ(a.fullatt_block_indexes, (std::vector<int64_t>{7, 15, 23, 31}));
  EXPECT_EQ(a.in_channels, 3);
  EXPECT_EQ(a.video_token_id, 151656);  // transformers' default
  const VisionConfig b = parse_vision_config(qwen3_vl().dump(), "c.json");
  EXPECT_EQ(b.tower, VisionTowerKind::kQwen3Vl);
  EXPECT_EQ(b.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(b.deepstack_visual_indexes, (std::vector<int64_t>{5, 11, 17}));
  EXPECT_EQ(b.temporal_patch_size, 2);
  EXPECT_EQ(b.spatial_merge_size, 2);
  EXPECT_TRUE(has_vision_tower("qwen3_vl_moe"));
  EXPECT_FALSE(has_vision_tower("qwen3"));
}

TEST(VisionConfig, BadFieldsAreRefused) {
  json d = qwen2_5_vl();
  d["vision_config"].erase("depth");
  EXPECT_EQ(err(d), "c.json: missing required field 'vision_config.depth' (a positive integer)");
  d = qwen2_5_vl();
  d["vision_config"]["num_heads"] = 12;
  EXPECT_NE(err(d).find("'vision_config.num_heads': the width 1280 over 12 heads"),
            std::string::npos);
  d = qwen2_5_vl();
  d["vision_config"]["out_hidden_size"] = 2048;
  EXPECT_EQ(
      err(d),
      "c.json: field 'vision_config.out_hidden_size': the merger's output 2048 must equal the "
      "language model's hidden_size 3584");
  d = qwen2_5_vl();
  d["vision_config"]["fullatt_block_indexes"] = json::array({7, 32});
  EXPECT_EQ(err(d),
            "c.json: field 'vision_config.fullatt_block_indexes': entry 32 names a block past the "
            "tower's depth 32");
  d = qwen2_5_vl();
  d["vision_config"]["hidden_act"] = "gelu";
  EXPECT_NE(err(d).find("expected \"silu\" (Qwen2.5-VL's gated MLP)"), std::string::npos);
  d = qwen2_5_vl();
  d["vision_config"]["hidden_act"] = "relu";
  EXPECT_NE(err(d).find("found \"relu\""), std::string::npos);
  d = qwen2_5_vl();
  d["vision_config"]["model_type"] = "qwen3_vl_vision";
  EXPECT_NE(err(d).find("expected \"qwen2_5_vl_vision\" (or \"qwen2_5_vl\")"), std::string::npos);
  d = qwen2_5_vl();
  d["vision_config"]["rope_parameters"] = {{"rope_type", "default"}};
  EXPECT_NE(err(d).find("expected \"axial\""), std::string::npos);
  d = qwen2_5_vl();
  d.erase("vision_config");
  EXPECT_NE(err(d).find("missing required field 'vision_config'"), std::string::npos);
  d = qwen2_5_vl();
  d["model_type"] = "qwen3";
  EXPECT_NE(err(d).find("\"qwen3\" has no vision tower"), std::string::npos);
  d = qwen2_5_vl();
  d["vocab_size"] = 1000;
  EXPECT_EQ(err(d),
            "c.json: field 'image_token_id': expected a token id in [0, vocab_size 1000), found "
            "151655 (transformers' default)");
  d = qwen3_vl();
  d["vision_config"]["num_position_embeddings"] = 2300;
  EXPECT_NE(err(d).find("expected a square"), std::string::npos);
  d = qwen3_vl();
  d["vision_config"]["deepstack_visual_indexes"] = json::array({11, 5});
  EXPECT_NE(err(d).find("expected ascending block indexes, found 11 then 5"), std::string::npos);
  d = test::read_json("tests/data/configs/qwen3_5/config.json");
  d["vision_config"]["deepstack_visual_indexes"] = json::array({3});
  EXPECT_NE(err(d).find("has no deepstack mergers"), std::string::npos);
}

// The language model of Qwen2-VL: Qwen2's decoder with a sectioned multimodal rope.
TEST(Qwen2VlLanguageModel, NestedFixtureAndFlatPublishedLayout) {
  const ModelConfig f = load_model_config("tests/data/fixtures/qwen2_vl_f32");
  EXPECT_EQ(f.text_model_type, "qwen2_vl_text");
  EXPECT_EQ(f.hidden_size, 32);
  EXPECT_TRUE(f.attention_qkv_bias);
  EXPECT_FALSE(f.attention_out_bias);
  EXPECT_EQ(f.rope.mrope_section, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_FALSE(f.rope.mrope_interleaved);
  EXPECT_FALSE(f.vision_config_json.empty());
  // Qwen/Qwen2-VL-2B-Instruct's config.json layout (transformers 4.41): flat text fields and a
  // rope_scaling of type "mrope".
  json flat = json::parse(R"({"model_type": "qwen2_vl", "hidden_size": 1536,
    "intermediate_size": 8960, "num_attention_heads": 12, "num_hidden_layers": 28,
    "num_key_value_heads": 2, "max_position_embeddings": 32768, "max_window_layers": 28,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "use_sliding_window": false, "tie_word_embeddings": true, "vocab_size": 151936,
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
      "in_chans": 3, "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2,
      "spatial_patch_size": 14, "temporal_patch_size": 2}})");
  const ModelConfig c = parse_model_config(flat.dump(), "c.json");
  EXPECT_EQ(c.text_model_type, "qwen2_vl");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.mrope_section, (std::vector<int64_t>{16, 24, 24}));
  EXPECT_EQ(c.layer_kinds[27], LayerKind::kFullAttention);
  const VisionConfig v = parse_vision_config(flat.dump(), "c.json");
  EXPECT_EQ(v.width, 1280);
  EXPECT_EQ(v.mlp_width, 5120);
  EXPECT_EQ(v.hidden_act, "quick_gelu");  // Qwen2VLVisionConfig's default
  // Without rope_theta: Qwen2VLTextConfig's default_theta 1e6; a section not covering the
  // rotary dim is refused.
  flat.erase("rope_theta");
  EXPECT_EQ(parse_model_config(flat.dump(), "c.json").rope.theta, 1e6);
  flat["rope_scaling"]["mrope_section"] = json::array({16, 24, 16});
  EXPECT_NE(test::error_of([&] {
              parse_model_config(flat.dump(), "c.json");
            }).find("entries sum to 56 frequency slots, but the rotary dim 128 has 64"),
            std::string::npos);
}

// GLM-4.1V-9B's config (its vision_config and the text fields that decide shapes): the tower's
// widths come from out_hidden_size (the blocks' MLP) and intermediate_size (the merger's), the
// position table from image_size / patch_size; the media ids' defaults, vision start / end
// named image_start_token_id / image_end_token_id; the language model's rope over half of each
// head, sectioned [8, 12, 12] (the default), on adjacent pairs.
TEST(VisionConfig, Glm4v) {
  json d = json::parse(R"({"model_type": "glm4v", "image_start_token_id": 151339,
    "text_config": {"model_type": "glm4v_text", "vocab_size": 151552, "hidden_size": 4096,
      "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
      "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000,
        "partial_rotary_factor": 0.5}},
    "vision_config": {"model_type": "glm4v_vision", "depth": 24, "hidden_size": 1536,
      "intermediate_size": 13696, "num_heads": 12, "out_hidden_size": 4096, "patch_size": 14,
      "image_size": 336, "spatial_merge_size": 2, "temporal_patch_size": 2,
      "rms_norm_eps": 1e-05, "attention_bias": false, "hidden_act": "silu"}})");
  const VisionConfig v = parse_vision_config(d.dump(), "c.json");
  EXPECT_EQ(v.tower, VisionTowerKind::kGlm4v);
  EXPECT_EQ(v.head_dim, 128);
  EXPECT_EQ(v.mlp_width, 4096);
  EXPECT_EQ(v.merger_width, 13696);
  EXPECT_EQ(v.num_position_embeddings, 24 * 24);
  EXPECT_EQ(v.norm_eps, 1e-5);
  EXPECT_FALSE(v.qkv_bias);
  EXPECT_EQ(v.image_token_id, 151343);
  EXPECT_EQ(v.video_token_id, 151344);
  EXPECT_EQ(v.vision_start_token_id, 151339);
  EXPECT_EQ(v.vision_end_token_id, 151340);
  EXPECT_TRUE(has_vision_tower("glm4v"));
  const ModelConfig m = parse_model_config(d.dump(), "c.json");
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.rope.rotary_dim, 64);
  EXPECT_EQ(m.rope.mrope_section, (std::vector<int64_t>{8, 12, 12}));
  EXPECT_FALSE(m.rope.mrope_interleaved);
  EXPECT_TRUE(m.rope.pairs_interleaved);
  EXPECT_TRUE(m.attention_qkv_bias);
  EXPECT_FALSE(m.attention_out_bias);
  // GLM-4.5V (glm4v_moe): the same tower, its own media ids; glm4_moe's decoder with the
  // sectioned rope on rotate_half, over half of each head by default, attention_bias by default.
  json e = d;
  e["model_type"] = "glm4v_moe";
  e["vision_config"]["model_type"] = "glm4v_moe_vision";
  e["text_config"] = json::parse(R"({"model_type": "glm4v_moe_text", "vocab_size": 151424,
    "hidden_size": 4096, "num_hidden_layers": 46, "num_attention_heads": 96,
    "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 128, "num_experts_per_tok": 8,
    "moe_intermediate_size": 1408, "intermediate_size": 10944, "num_nextn_predict_layers": 1})");
  const VisionConfig ev = parse_vision_config(e.dump(), "c.json");
  EXPECT_EQ(ev.tower, VisionTowerKind::kGlm4v);
  EXPECT_EQ(ev.image_token_id, 151363);
  const ModelConfig em = parse_model_config(e.dump(), "c.json");
  EXPECT_EQ(em.rope.rotary_dim, 64);  // head_dim 128 x 0.5
  EXPECT_FALSE(em.rope.pairs_interleaved);
  EXPECT_EQ(em.rope.mrope_section, (std::vector<int64_t>{8, 12, 12}));
  EXPECT_TRUE(em.attention_qkv_bias);
  EXPECT_EQ(em.n_mtp_layers, 0);
  d["vision_config"].erase("image_size");
  EXPECT_EQ(err(d),
            "c.json: missing required field 'vision_config.image_size' (a positive integer)");
}

}  // namespace
}  // namespace metrale
