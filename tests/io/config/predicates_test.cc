// The per-model-type predicates, one case per type. The expected values were measured against
// transformers 5.x by tools/fixtures/configs/make_expectations.py (norms run with zero weights)
// and check_chunked_prefill.py (one prefill vs the same prompt in chunks); the comment on each
// row names the modeling class that decides it.
#include <string>

#include "config_test_util.h"

namespace metrale {
namespace {

struct PredicateCase {
  const char* model_type;
  bool vanilla_norm;
  const char* norm_class;  // the HF class whose forward decides vanilla_norm
};

const PredicateCase kCases[] = {
    {"llama", true, "LlamaRMSNorm: weight * x"},
    {"mistral", true, "MistralRMSNorm: weight * x"},
    {"qwen2", true, "Qwen2RMSNorm: weight * x"},
    {"qwen3", true, "Qwen3RMSNorm: weight * x"},
    {"qwen3_moe", true, "Qwen3MoeRMSNorm: weight * x"},
    {"qwen3_next", false, "Qwen3NextRMSNorm: x * (1 + weight), zero-initialised"},
    {"qwen3_5", false, "Qwen3_5RMSNorm: x * (1 + weight), zero-initialised"},
    {"qwen3_5_moe", false, "Qwen3_5MoeRMSNorm: x * (1 + weight), zero-initialised"},
    {"deepseek_v3", true, "DeepseekV3RMSNorm: weight * x"},
    {"glm4_moe", true, "Glm4MoeRMSNorm: weight * x"},
};

class PredicateTest : public ::testing::TestWithParam<PredicateCase> {};

TEST_P(PredicateTest, VanillaNormWeights) {
  const PredicateCase& p = GetParam();
  EXPECT_EQ(p.vanilla_norm, model_type_ships_vanilla_norm_weights(p.model_type)) << p.norm_class;
  // The committed expectation was measured by running the HF norm, not copied from this table.
  EXPECT_EQ(test::expectations()[p.model_type]["ships_vanilla_norm_weights"].get<bool>(),
            p.vanilla_norm)
      << p.norm_class;
  ModelConfig c = load_model_config(std::string(test::kConfigsDir) + "/" + p.model_type);
  EXPECT_EQ(p.vanilla_norm, ships_vanilla_norm_weights(c));
}

// Softmax attention (every type), the gated delta net of qwen3_next / qwen3_5 / qwen3_5_moe
// (Qwen3NextGatedDeltaNet etc.: conv window prepended from the cache, chunk rule seeded with the
// cached recurrent state) and MLA (DeepseekV3Attention: latent cache re-expanded each call) all
// continue a prefill across chunks in transformers 5.x.
TEST_P(PredicateTest, ChunkedPrefillIsContinuable) {
  const PredicateCase& p = GetParam();
  bool measured = test::expectations()[p.model_type]["requires_single_chunk_prefill"].get<bool>();
  ModelConfig c = load_model_config(std::string(test::kConfigsDir) + "/" + p.model_type);
  EXPECT_EQ(measured, requires_single_chunk_prefill(c));
  EXPECT_EQ(measured, requires_single_chunk_prefill(p.model_type, c.mla.kv_lora_rank));
  EXPECT_FALSE(requires_single_chunk_prefill(c));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, PredicateTest, ::testing::ValuesIn(kCases),
                         [](const auto& p) { return std::string(p.param.model_type); });

// transformers 5.24 saves a text-only Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM with its
// text config's model_type; the same decoder as the vision-language type, not nested.
const char* const kTextOnly[][2] = {{"qwen3_5_text", "qwen3_5"},
                                    {"qwen3_5_moe_text", "qwen3_5_moe"}};

// Vision-language types whose language model is an existing decoder, checked on their tiny
// fixture's config: qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe, glm4v, glm4v_moe
// (Qwen2VLRMSNorm / Qwen2_5_VLRMSNorm / Qwen3VLTextRMSNorm / Qwen3VLMoeTextRMSNorm /
// Glm4vRMSNorm / Glm4vMoeTextRMSNorm return weight * x; softmax attention continues across
// chunks).
const char* const kVisionLanguage[][2] = {{"qwen2_vl", "tests/data/fixtures/qwen2_vl_f32"},
                                          {"qwen2_5_vl", "tests/data/fixtures/qwen2_5_vl_f32"},
                                          {"qwen3_vl", "tests/data/fixtures/qwen3_vl_f32"},
                                          {"qwen3_vl_moe", "tests/data/fixtures/qwen3_vl_moe_f32"},
                                          {"glm4v", "tests/data/fixtures/glm4v_f32"},
                                          {"glm4v_moe", "tests/data/fixtures/glm4v_moe_f32"}};

TEST(Predicates, EveryListedTypeIsCovered) {
  EXPECT_EQ(std::size(kCases) + std::size(kTextOnly) + std::size(kVisionLanguage),
            supported_model_types().size());
  for (const auto& [type, dir] : kVisionLanguage) {
    const ModelConfig c = load_model_config(dir);
    EXPECT_EQ(c.model_type, type);
    EXPECT_TRUE(ships_vanilla_norm_weights(c)) << type;
    EXPECT_FALSE(requires_single_chunk_prefill(c)) << type;
  }
  for (const PredicateCase& p : kCases)
    EXPECT_TRUE(is_supported_model_type(p.model_type)) << p.model_type;
  for (const auto& [text, vlm] : kTextOnly) {
    EXPECT_EQ(model_type_ships_vanilla_norm_weights(text),
              model_type_ships_vanilla_norm_weights(vlm))
        << text;
    EXPECT_FALSE(requires_single_chunk_prefill(text, 0)) << text;
  }
}

TEST(Predicates, UnknownTypeIsAnError) {
  std::string msg = test::error_of([] { model_type_ships_vanilla_norm_weights("gpt2"); });
  EXPECT_NE(msg.find("\"gpt2\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("qwen3_next"), std::string::npos) << msg;  // lists what is supported
  msg = test::error_of([] { requires_single_chunk_prefill("gemma3", 0); });
  EXPECT_NE(msg.find("\"gemma3\""), std::string::npos) << msg;
  EXPECT_FALSE(
      is_supported_model_type("qwen3_5_vision"));  // the vision tower's type is not a decoder
}

TEST(Predicates, MlaNeedsALatentRank) {
  // deepseek_v3 is MLA: kv_lora_rank 0 describes no latent cache at all.
  std::string msg = test::error_of([] { requires_single_chunk_prefill("deepseek_v3", 0); });
  EXPECT_NE(msg.find("kv_lora_rank"), std::string::npos) << msg;
  EXPECT_FALSE(requires_single_chunk_prefill("deepseek_v3", 512));
  EXPECT_NE(test::error_of([] { requires_single_chunk_prefill("llama", -1); }).find("kv_lora_rank"),
            std::string::npos);
}

}  // namespace
}  // namespace metrale
