// Every committed real-checkpoint config (and every edited variant of one) parses to what
// HuggingFace transformers derives from it, as recorded in tests/data/configs/expectations.json
// by tools/fixtures/configs/make_expectations.py.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "config_test_util.h"

namespace metrale {
namespace {

using nlohmann::json;
using test::expectations;
using test::kConfigsDir;

const char* const kTypes[] = {"llama",      "mistral", "qwen2",       "qwen3",       "qwen3_moe",
                              "qwen3_next", "qwen3_5", "qwen3_5_moe", "deepseek_v3", "glm4_moe"};

void expect_near_rel(double want, double got, const std::string& what) {
  EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::abs(want))) << what;
}

void expect_rope(const json& want, const RopeConfig& got) {
  EXPECT_EQ(want["type"].get<std::string>(), rope_type_name(got.type));
  expect_near_rel(want["theta"], got.theta, "rope theta");
  expect_near_rel(want["partial_rotary_factor"], got.partial_rotary_factor,
                  "partial_rotary_factor");
  EXPECT_EQ(want["rotary_dim"].get<int64_t>(), got.rotary_dim);
  expect_near_rel(want["attention_factor"], got.attention_factor, "rope attention_factor");
  if (got.type != RopeType::kDefault) expect_near_rel(want["factor"], got.factor, "rope factor");
  if (want.contains("original_max_position_embeddings")) {
    EXPECT_EQ(want["original_max_position_embeddings"].get<int64_t>(),
              got.original_max_position_embeddings);
  }
  if (got.type == RopeType::kLlama3) {
    expect_near_rel(want["low_freq_factor"], got.low_freq_factor, "low_freq_factor");
    expect_near_rel(want["high_freq_factor"], got.high_freq_factor, "high_freq_factor");
  }
  if (got.type == RopeType::kYarn) {
    // HF reads `get("beta_fast") or 32`: absent keys mean the defaults.
    expect_near_rel(want.value("beta_fast", 32.0), got.beta_fast, "beta_fast");
    expect_near_rel(want.value("beta_slow", 1.0), got.beta_slow, "beta_slow");
    EXPECT_EQ(want.contains("mscale"), got.mscale.has_value());
    EXPECT_EQ(want.contains("mscale_all_dim"), got.mscale_all_dim.has_value());
  }
  std::vector<int64_t> mrope = want.value("mrope_section", std::vector<int64_t>{});
  EXPECT_EQ(mrope, got.mrope_section);
  EXPECT_EQ(!mrope.empty(), got.mrope_interleaved);
  EXPECT_EQ(want.value("pairs_interleaved", false), got.pairs_interleaved);
}

void expect_moe(const json& want, const ModelConfig& c) {
  const MoeConfig& m = c.moe;
  EXPECT_EQ(want["n_experts"].get<int64_t>(), m.n_experts);
  EXPECT_EQ(want["n_experts_per_tok"].get<int64_t>(), m.n_experts_per_tok);
  EXPECT_EQ(want["moe_intermediate_size"].get<int64_t>(), m.moe_intermediate_size);
  EXPECT_EQ(want["shared_expert_intermediate_size"].get<int64_t>(),
            m.shared_expert_intermediate_size);
  EXPECT_EQ(want["shared_experts_width"].get<int64_t>(),
            m.n_shared_experts * m.moe_intermediate_size);
  EXPECT_EQ(want["has_shared_expert_gate"].get<bool>(), m.has_shared_expert_gate);
  EXPECT_EQ(want["has_e_score_correction_bias"].get<bool>(), m.has_e_score_correction_bias);
  EXPECT_EQ(want["norm_topk_prob"].get<bool>(), m.norm_topk_prob);
  expect_near_rel(want["routed_scaling_factor"], m.routed_scaling_factor, "routed_scaling_factor");
  EXPECT_EQ(want["n_group"].get<int64_t>(), m.n_group);
  EXPECT_EQ(want["topk_group"].get<int64_t>(), m.topk_group);
  EXPECT_EQ(want["scoring"].get<std::string>(),
            m.scoring == MoeScoring::kSigmoid ? "sigmoid" : "softmax");
}

void expect_matches(const json& want, const ModelConfig& c) {
  EXPECT_EQ(want["text_model_type"].get<std::string>(), c.text_model_type);
  EXPECT_EQ(want["vocab_size"].get<int64_t>(), c.vocab_size);
  EXPECT_EQ(want["hidden_size"].get<int64_t>(), c.hidden_size);
  EXPECT_EQ(want["n_layers"].get<int64_t>(), c.n_layers);
  EXPECT_EQ(want["n_heads"].get<int64_t>(), c.n_heads);
  EXPECT_EQ(want["n_kv_heads"].get<int64_t>(), c.n_kv_heads);
  EXPECT_EQ(want["head_dim"].get<int64_t>(), c.head_dim);
  if (!want["intermediate_size"].is_null()) {
    EXPECT_EQ(want["intermediate_size"].get<int64_t>(), c.intermediate_size);
  }
  expect_near_rel(want["rms_norm_eps"], c.rms_norm_eps, "rms_norm_eps");
  EXPECT_EQ(want["max_position_embeddings"].get<int64_t>(), c.max_position_embeddings);
  EXPECT_EQ(want["tie_word_embeddings"].get<bool>(), c.tie_word_embeddings);
  EXPECT_EQ(want["dtype"].get<std::string>(), c.dtype_name);
  EXPECT_EQ(want["eos_token_ids"].get<std::vector<int64_t>>(), c.eos_token_ids);
  EXPECT_EQ(want["attention_qkv_bias"].get<bool>(), c.attention_qkv_bias);
  EXPECT_EQ(want["attention_out_bias"].get<bool>(), c.attention_out_bias);
  EXPECT_EQ(want["qk_norm"].get<bool>(), c.qk_norm);
  EXPECT_EQ(want["attention_output_gate"].get<bool>(), c.attention_output_gate);
  expect_near_rel(want["attention_scale"], c.attention_scale, "attention_scale");
  EXPECT_EQ(want["n_mtp_layers"].get<int64_t>(), c.n_mtp_layers);
  EXPECT_EQ(want["has_quantization_config"].get<bool>(), !c.quantization_config_json.empty());
  EXPECT_EQ(want["has_vision_config"].get<bool>(), !c.vision_config_json.empty());
  EXPECT_EQ(want["sliding_window"].is_null() ? std::optional<int64_t>()
                                             : want["sliding_window"].get<int64_t>(),
            c.sliding_window);

  std::vector<std::string> kinds;
  for (int64_t i = 0; i < c.n_layers; ++i) kinds.emplace_back(layer_kind_name(c.layer_kind(i)));
  EXPECT_EQ(want["layer_kinds"].get<std::vector<std::string>>(), kinds);
  std::vector<int64_t> moe_layers;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    if (c.is_moe_layer(i)) moe_layers.push_back(i);
  }
  EXPECT_EQ(want["moe_layers"].get<std::vector<int64_t>>(), moe_layers);

  expect_rope(want["rope"], c.rope);
  if (want.contains("moe")) expect_moe(want["moe"], c);
  EXPECT_EQ(want.contains("moe"), c.moe.n_experts > 0);
  EXPECT_EQ(want.contains("linear"), c.has_linear_attention());
  if (want.contains("linear")) {
    const json& l = want["linear"];
    EXPECT_EQ(l["n_key_heads"].get<int64_t>(), c.linear.n_key_heads);
    EXPECT_EQ(l["n_value_heads"].get<int64_t>(), c.linear.n_value_heads);
    EXPECT_EQ(l["key_head_dim"].get<int64_t>(), c.linear.key_head_dim);
    EXPECT_EQ(l["value_head_dim"].get<int64_t>(), c.linear.value_head_dim);
    EXPECT_EQ(l["conv_kernel_dim"].get<int64_t>(), c.linear.conv_kernel_dim);
  }
  EXPECT_EQ(want.contains("mla"), c.is_mla());
  if (want.contains("mla")) {
    const json& m = want["mla"];
    EXPECT_EQ(
        m["q_lora_rank"].is_null() ? std::optional<int64_t>() : m["q_lora_rank"].get<int64_t>(),
        c.mla.q_lora_rank);
    EXPECT_EQ(m["kv_lora_rank"].get<int64_t>(), c.mla.kv_lora_rank);
    EXPECT_EQ(m["qk_nope_head_dim"].get<int64_t>(), c.mla.qk_nope_head_dim);
    EXPECT_EQ(m["qk_rope_head_dim"].get<int64_t>(), c.mla.qk_rope_head_dim);
    EXPECT_EQ(m["v_head_dim"].get<int64_t>(), c.mla.v_head_dim);
  }
  EXPECT_EQ(want["ships_vanilla_norm_weights"].get<bool>(), ships_vanilla_norm_weights(c));
  EXPECT_EQ(want["requires_single_chunk_prefill"].get<bool>(), requires_single_chunk_prefill(c));
}

class RealConfigTest : public ::testing::TestWithParam<const char*> {};

TEST_P(RealConfigTest, MatchesTransformers) {
  std::string type = GetParam();
  ModelConfig c = load_model_config(std::string(kConfigsDir) + "/" + type);
  EXPECT_EQ(type, c.model_type);
  expect_matches(expectations()[type], c);
}

TEST_P(RealConfigTest, DescribeMentionsTheArchitecture) {
  ModelConfig c = load_model_config(std::string(kConfigsDir) + "/" + GetParam());
  std::string text = describe(c);
  EXPECT_NE(text.find("model_type: " + c.model_type), std::string::npos) << text;
  EXPECT_NE(text.find("head_dim " + std::to_string(c.head_dim)), std::string::npos) << text;
  EXPECT_NE(text.find(std::string("rope: ") + std::string(rope_type_name(c.rope.type))),
            std::string::npos)
      << text;
  EXPECT_EQ(c.moe.n_experts > 0,
            text.find("moe: " + std::to_string(c.moe.n_experts) + " experts") != std::string::npos)
      << text;
  EXPECT_EQ(c.has_linear_attention(), text.find("linear attention:") != std::string::npos) << text;
  EXPECT_EQ(c.is_mla(), text.find("mla: ") != std::string::npos) << text;
  EXPECT_GE(std::count(text.begin(), text.end(), '\n'), 6);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, RealConfigTest, ::testing::ValuesIn(kTypes),
                         [](const auto& p) { return std::string(p.param); });

TEST(ModelConfigVariants, EachMatchesTransformers) {
  json variants = test::read_json(std::string(kConfigsDir) + "/variants.json")["variants"];
  ASSERT_GE(variants.size(), 20u);
  for (const json& v : variants) {
    std::string name = v["name"];
    SCOPED_TRACE(name);
    std::string base = std::string(kConfigsDir) + "/" + v["base"].get<std::string>();
    json doc = test::apply_variant(test::read_json(base + "/config.json"), v);
    std::string gen_path = base + "/generation_config.json";
    std::optional<std::string> gen;
    if (std::filesystem::exists(gen_path)) gen = test::read_text(gen_path);
    ModelConfig c =
        gen ? parse_model_config(doc.dump(), name, *gen) : parse_model_config(doc.dump(), name);
    expect_matches(expectations()["variants"][name], c);
  }
}

TEST(ModelConfig, GenerationConfigEosMergesWithoutDuplicates) {
  ModelConfig c = load_model_config(std::string(kConfigsDir) + "/qwen3");
  EXPECT_EQ((std::vector<int64_t>{151645, 151643}),
            c.eos_token_ids);  // config 151645 + gen [151645, 151643]
  EXPECT_EQ(std::optional<int64_t>(151643), c.pad_token_id);  // only generation_config has it
  std::string text = test::read_text(std::string(kConfigsDir) + "/qwen3/config.json");
  ModelConfig alone = parse_model_config(text, "config.json");
  EXPECT_EQ((std::vector<int64_t>{151645}), alone.eos_token_ids);
  EXPECT_FALSE(alone.pad_token_id.has_value());
}

TEST(ModelConfig, KeepsRawQuantizationAndVisionJson) {
  ModelConfig ds = load_model_config(std::string(kConfigsDir) + "/deepseek_v3");
  json q = json::parse(ds.quantization_config_json);
  EXPECT_EQ("fp8", q["quant_method"]);
  EXPECT_EQ((std::vector<int>{128, 128}), q["weight_block_size"].get<std::vector<int>>());
  EXPECT_NE(describe(ds).find("quantization: fp8"), std::string::npos);
  ModelConfig vl = load_model_config(std::string(kConfigsDir) + "/qwen3_5");
  EXPECT_EQ(12, json::parse(vl.vision_config_json)["depth"]);
  EXPECT_EQ(DType::kBF16, vl.dtype);
}

TEST(ModelConfig, LoadNamesTheMissingFile) {
  std::string msg = test::error_of([] { load_model_config("tests/data/configs/no_such_dir"); });
  EXPECT_NE(msg.find("no_such_dir/config.json"), std::string::npos) << msg;
}

TEST(ModelConfig, LayerIndexOutOfRangeIsAnError) {
  ModelConfig c = load_model_config(std::string(kConfigsDir) + "/llama");
  EXPECT_NE(test::error_of([&] { c.layer_kind(16); }).find("layer 16 is out of range"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { c.is_moe_layer(-1); }).find("layer -1 is out of range"),
            std::string::npos);
}

}  // namespace
}  // namespace metrale
