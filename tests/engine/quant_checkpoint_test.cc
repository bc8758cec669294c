// Quantized checkpoints as their producers write them: the format each linear module is
// loaded in (and the rule that decided it) equals what the producer wrote, per module
// (quant_layout.json beside each fixture, read off the files by the fixture script); and a
// checkpoint whose config, tensors or scales are wrong is refused naming the field or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint_copy.h"
#include "core/error.h"
#include "engine/model.h"
#include "support/test_support.h"

namespace metrale {
namespace {

using test::error_of;
using testing::CheckpointCopy;

class QuantLayout : public ::testing::TestWithParam<std::string> {};

// The part of the loaded format string a producer's layout entry implies.
std::vector<std::string> expected_parts(const nlohmann::json& e) {
  const std::string scheme = e["scheme"];
  if (scheme == "unquantized") return {"bf16"};
  std::vector<std::string> parts;
  const int bits = e["bits"];
  if (scheme == "int") parts.push_back(bits == 4 ? "int4 " : "int8 ");
  if (scheme == "float8") parts.push_back("fp8 ");
  if (scheme == "nvfp4") parts.push_back("nvfp4 group 16");
  const std::string strategy = e["strategy"].is_string() ? e["strategy"].get<std::string>() : "";
  if (strategy == "group") parts.push_back("group " + std::to_string(e["group_size"].get<int>()));
  if (strategy == "channel" || strategy == "tensor") parts.push_back(strategy);
  if (strategy == "block") {
    parts.push_back("block " + std::to_string(e["block"][0].get<int>()) + "x" +
                    std::to_string(e["block"][1].get<int>()));
  }
  if (e["symmetric"].is_boolean() && !e["symmetric"].get<bool>()) parts.push_back(" asym");
  if (e["g_idx"].get<bool>()) parts.push_back(" actorder");
  return parts;
}

TEST_P(QuantLayout, EveryModuleLoadsInTheFormatItsProducerWrote) {
  const std::string dir = testing::fixture_dir(GetParam());
  std::ifstream in(dir + "/quant_layout.json");
  const nlohmann::json layout = nlohmann::json::parse(in);
  LoadOptions o = testing::small_load_options();
  const std::unique_ptr<Model> model = Model::load(dir, o);
  std::map<std::string, std::string> loaded;
  for (const TensorLoader::ModuleReport& r : model->linear_report()) loaded[r.module] = r.format;
  EXPECT_EQ(loaded.size(), layout.size());
  for (const auto& [module, entry] : layout.items()) {
    ASSERT_TRUE(loaded.count(module)) << module << " was not loaded";
    for (const std::string& part : expected_parts(entry)) {
      EXPECT_NE(loaded[module].find(part), std::string::npos)
          << module << ": loaded as '" << loaded[module] << "', expected '" << part << "'";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantLayout,
                         ::testing::Values("quant_ct_w4a16", "quant_ct_w4a16_asym",
                                           "quant_ct_gptq_actorder", "quant_ct_w8a16",
                                           "quant_ct_mixed", "quant_ct_fp8_dynamic", "quant_ct_fp8",
                                           "quant_ct_nvfp4a16", "quant_modelopt_fp8",
                                           "quant_modelopt_nvfp4", "quant_modelopt_w4a16_nvfp4",
                                           "quant_fp8_block"));

TEST(QuantLayout, IgnoreListsAreReported) {
  const std::unique_ptr<Model> model =
      Model::load(testing::fixture_dir("quant_ct_mixed"), testing::small_load_options());
  std::map<std::string, std::string> rule;
  for (const TensorLoader::ModuleReport& r : model->linear_report()) rule[r.module] = r.rule;
  EXPECT_NE(rule["lm_head"].find("ignore 'lm_head'"), std::string::npos) << rule["lm_head"];
  EXPECT_NE(rule["model.layers.0.mlp.down_proj"].find("ignore"), std::string::npos);
  EXPECT_NE(rule["model.layers.0.self_attn.q_proj"].find("re:"), std::string::npos);
  EXPECT_EQ(model->quant_method(), "compressed-tensors");
}

// --- bad input ---

using testing::expect_has;
using testing::load_error;

TEST(QuantBadInput, ConfigDeclaresQuantizedButTheWeightIsPlain) {
  CheckpointCopy c("quant_ct_w4a16");
  c.replace_in_config("\"lm_head\"", "\"model.nothing\"");  // lm_head no longer ignored
  const std::string msg = load_error(c);
  expect_has(msg, "module 'lm_head'");
  expect_has(msg, "plain bf16");
}

TEST(QuantBadInput, IgnoredModuleHoldsQuantizedTensors) {
  CheckpointCopy c("quant_ct_w4a16");
  c.replace_in_config("\"lm_head\"", "\"lm_head\", \"re:.*layers\\\\.1\\\\.mlp\\\\.up_proj$\"");
  const std::string msg = load_error(c);
  expect_has(msg, "model.layers.1.mlp.up_proj");
  expect_has(msg, "keeps it unquantized");
}

TEST(QuantBadInput, MalformedIgnoreEntry) {
  CheckpointCopy c("quant_ct_w4a16");
  c.replace_in_config("\"lm_head\"", "\"re:(lm_head\"");
  const std::string msg = load_error(c);
  expect_has(msg, "ignore[0]");
  expect_has(msg, "does not compile");
}

TEST(QuantBadInput, GroupSizeContradictsTheScales) {
  CheckpointCopy c("quant_ct_w4a16");
  c.replace_in_config("\"group_size\": 128", "\"group_size\": 64");
  const std::string msg = load_error(c);
  expect_has(msg, "weight_scale");
  expect_has(msg, "groups of 64");
}

TEST(QuantBadInput, UnsupportedMethod) {
  CheckpointCopy c("quant_ct_w4a16");
  c.replace_in_config("\"quant_method\": \"compressed-tensors\"", "\"quant_method\": \"awq\"");
  expect_has(load_error(c), "\"awq\" is not supported by this build");
}

TEST(QuantBadInput, MissingScale) {
  CheckpointCopy c("quant_modelopt_nvfp4");
  c.rewrite([](const std::string& n) { return n != "model.layers.0.mlp.up_proj.weight_scale"; });
  expect_has(load_error(c), "has no 'model.layers.0.mlp.up_proj.weight_scale'");
}

TEST(QuantBadInput, NonFiniteScale) {
  CheckpointCopy c("quant_fp8_block");
  c.rewrite_all([](SafetensorsWriter& w, const SafetensorsFile& f) {
    for (const auto& t : f.tensors()) {
      std::vector<std::byte> b(f.bytes(t).begin(), f.bytes(t).end());
      if (t.name == "model.layers.0.mlp.down_proj.weight_scale_inv") {
        const float inf = INFINITY;
        std::memcpy(b.data() + 4, &inf, 4);
      }
      w.add(t.name, t.dtype, t.shape, b);
    }
  });
  const std::string msg = load_error(c);
  expect_has(msg, "model.layers.0.mlp.down_proj");
  expect_has(msg, "inf");
}

}  // namespace
}  // namespace metrale
