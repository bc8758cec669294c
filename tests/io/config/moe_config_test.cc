// Qwen3-MoE configs in both layouts that exist: what transformers 5's save_pretrained writes
// (num_local_experts, rope_parameters, dtype) and what the published checkpoints carry
// (num_experts, rope_theta, torch_dtype), and the MoE lines of describe().
#include <string>
#include <vector>

#include "config_test_util.h"

namespace metrale {
namespace {

using nlohmann::json;

const char* const kFixturesDir = "tests/data/fixtures";

std::vector<int64_t> moe_layers(const ModelConfig& c) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    if (c.is_moe_layer(i)) out.push_back(i);
  }
  return out;
}

json qwen3_moe_config() {
  return test::read_json(std::string(test::kConfigsDir) + "/qwen3_moe/config.json");
}

// The model fixtures the engine's MoE parity tests run (tests/data/fixtures/README.md).
TEST(MoeConfig, ParsesTheQwen3MoeModelFixtures) {
  for (const char* dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(dtype);
    // Written by transformers 5.24 save_pretrained: num_local_experts, rope_parameters, dtype.
    ModelConfig a = load_model_config(std::string(kFixturesDir) + "/qwen3_moe_" + dtype);
    EXPECT_EQ(8, a.moe.n_experts);
    EXPECT_EQ(2, a.moe.n_experts_per_tok);
    EXPECT_EQ(48, a.moe.moe_intermediate_size);
    EXPECT_TRUE(a.moe.norm_topk_prob);
    EXPECT_EQ(MoeScoring::kSoftmax, a.moe.scoring);
    EXPECT_EQ((std::vector<int64_t>{0, 2}), moe_layers(a));
    EXPECT_EQ(160, a.intermediate_size);
    EXPECT_EQ(32, a.head_dim);
    EXPECT_TRUE(a.qk_norm);
    EXPECT_TRUE(a.tie_word_embeddings);
    EXPECT_DOUBLE_EQ(60000.0, a.rope.theta);
    EXPECT_EQ(std::string(dtype) == "f32" ? "float32" : "bfloat16", a.dtype_name);
    EXPECT_EQ((std::vector<int64_t>{391, 387}), a.eos_token_ids);

    // Rewritten to the Hub layout: num_experts, rope_theta, torch_dtype.
    ModelConfig b = load_model_config(std::string(kFixturesDir) + "/qwen3_moe_nonorm_" + dtype);
    EXPECT_EQ(10, b.moe.n_experts);
    EXPECT_EQ(2, b.moe.n_experts_per_tok);
    EXPECT_EQ(32, b.moe.moe_intermediate_size);
    EXPECT_FALSE(b.moe.norm_topk_prob);
    EXPECT_EQ((std::vector<int64_t>{1, 3}), moe_layers(b));
    EXPECT_EQ(96, b.intermediate_size);
    EXPECT_FALSE(b.tie_word_embeddings);
    EXPECT_DOUBLE_EQ(1e6, b.rope.theta);
    EXPECT_EQ(std::string(dtype) == "f32" ? "float32" : "bfloat16", b.dtype_name);
  }
}

TEST(MoeConfig, Qwen3MoeTakesEitherSpellingOfTheExpertCount) {
  json local = qwen3_moe_config();
  local.erase("num_experts");
  local["num_local_experts"] = 64;
  EXPECT_EQ(64, parse_model_config(local.dump(), "local.json").moe.n_experts);

  json both = qwen3_moe_config();
  both["num_local_experts"] = 128;
  EXPECT_EQ(128, parse_model_config(both.dump(), "both.json").moe.n_experts);

  both["num_local_experts"] = 96;
  std::string msg = test::error_of([&] { parse_model_config(both.dump(), "both.json"); });
  EXPECT_EQ(0u, msg.find("both.json: field 'num_local_experts': expected the same expert count as "
                         "num_experts 128"))
      << msg;
  EXPECT_NE(msg.find("found 96"), std::string::npos) << msg;

  // An explicit null is "absent", as in HF: the other spelling decides.
  both["num_local_experts"] = nullptr;
  EXPECT_EQ(128, parse_model_config(both.dump(), "both.json").moe.n_experts);
}

// Qwen3NextConfig / Qwen3_5MoeTextConfig have no num_local_experts alias: HF would ignore the
// key and build its default 512 / 256 experts, so the count must be spelled num_experts.
TEST(MoeConfig, HybridTypesReadOnlyNumExperts) {
  json next = test::read_json(std::string(test::kConfigsDir) + "/qwen3_next/config.json");
  next["num_local_experts"] = 7;  // ignored, as HF ignores it
  EXPECT_EQ(512, parse_model_config(next.dump(), "next.json").moe.n_experts);
  next.erase("num_experts");
  std::string msg = test::error_of([&] { parse_model_config(next.dump(), "next.json"); });
  EXPECT_NE(msg.find("missing required field 'num_experts'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model_type \"qwen3_next\" does not read 'num_local_experts'"),
            std::string::npos)
      << msg;
}

std::string describe_dir(const std::string& dir) { return describe(load_model_config(dir)); }

TEST(MoeDescribe, ListsRoutingAndWhichLayersAreSparse) {
  std::string a = describe_dir(std::string(kFixturesDir) + "/qwen3_moe_f32");
  EXPECT_NE(a.find("moe: 8 experts, top 2, expert width 48, softmax, norm_topk_prob true\n"),
            std::string::npos)
      << a;
  EXPECT_NE(a.find("moe layers: 0,2; dense: 1 (width 160)\n"), std::string::npos) << a;
  EXPECT_EQ(a.find("mlp: "), std::string::npos) << a;

  std::string b = describe_dir(std::string(kFixturesDir) + "/qwen3_moe_nonorm_f32");
  EXPECT_NE(b.find("moe: 10 experts, top 2, expert width 32, softmax, norm_topk_prob false\n"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find("moe layers: 1,3; dense: 0,2 (width 96)\n"), std::string::npos) << b;

  std::string real = describe_dir(std::string(test::kConfigsDir) + "/qwen3_moe");
  EXPECT_NE(real.find("moe: 128 experts, top 8, expert width 768, softmax, norm_topk_prob true\n"),
            std::string::npos)
      << real;
  EXPECT_NE(real.find("moe layers: 0-47; dense: none\n"), std::string::npos) << real;

  json mixed = qwen3_moe_config();
  mixed["mlp_only_layers"] = {0, 1, 2, 47};
  mixed["decoder_sparse_step"] = 1;
  std::string m = describe(parse_model_config(mixed.dump(), "mixed.json"));
  EXPECT_NE(m.find("moe layers: 3-46; dense: 0-2,47 (width 6144)\n"), std::string::npos) << m;

  mixed["mlp_only_layers"] = json::array();
  mixed["decoder_sparse_step"] = 4;  // layers 3, 7, ..., 47
  m = describe(parse_model_config(mixed.dump(), "mixed.json"));
  EXPECT_NE(m.find("moe layers: 3,7,11,15,19,23,27,31,35,39,43,47; dense: 0-2,4-6,8-10,"),
            std::string::npos)
      << m;

  std::string ds = describe_dir(std::string(test::kConfigsDir) + "/deepseek_v3");
  EXPECT_NE(ds.find("sigmoid, norm_topk_prob true, groups 4/8, scale 2.5, 1 shared\n"),
            std::string::npos)
      << ds;
  EXPECT_NE(ds.find("moe layers: 3-60; dense: 0-2 (width 18432)\n"), std::string::npos) << ds;

  std::string dense = describe_dir(std::string(test::kConfigsDir) + "/llama");
  EXPECT_EQ(dense.find("moe"), std::string::npos) << dense;
}

}  // namespace
}  // namespace metrale
