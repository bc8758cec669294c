// QuantConfig: the three dialects' configs, their matching rules (compressed-tensors targets
// and ignore entries, ModelOpt globs, fp8 module paths) and refusals of malformed entries.
#include "quant/quant_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace metrale {
namespace {

using Kind = ModuleScheme::Kind;

std::filesystem::path no_dir() { return std::filesystem::temp_directory_path() / "metrale-none"; }

// The error message of parse(json), or "" when it parses.
std::string parse_error(const std::string& json) {
  try {
    QuantConfig::parse(json, no_dir());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kMixed = R"({
  "quant_method": "compressed-tensors",
  "format": "mixed-precision",
  "config_groups": {
    "group_0": {"targets": ["re:.*self_attn\\.(q|k|v|o)_proj$"],
                "weights": {"num_bits": 8, "type": "int", "symmetric": true,
                            "strategy": "channel", "group_size": null, "actorder": null}},
    "group_1": {"targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": false,
                            "strategy": "group", "group_size": 128, "actorder": "group"}}
  },
  "ignore": ["lm_head", "re:.*layers\\.0\\.mlp\\.down_proj$"]
})";

TEST(QuantConfig, NoneDeclaredLetsTensorsDecide) {
  const QuantConfig c = QuantConfig::parse("", no_dir());
  EXPECT_EQ(c.dialect(), QuantDialect::kNone);
  EXPECT_EQ(c.scheme_for("model.layers.0.mlp.up_proj").kind, Kind::kAny);
}

TEST(QuantConfig, CompressedTensorsGroupsAndIgnore) {
  const QuantConfig c = QuantConfig::parse(kMixed, no_dir());
  EXPECT_EQ(c.dialect(), QuantDialect::kCompressedTensors);
  // The class target "Linear" sorts before regexes (compressed-tensors' order), so it wins
  // over group_0's regex for every module.
  const ModuleScheme q = c.scheme_for("model.layers.1.self_attn.q_proj");
  EXPECT_EQ(q.kind, Kind::kInt);
  const ModuleScheme up = c.scheme_for("model.layers.1.mlp.up_proj");
  EXPECT_EQ(up.kind, Kind::kInt);
  EXPECT_EQ(up.bits, 4);
  EXPECT_EQ(up.group_size, 128);
  EXPECT_FALSE(up.symmetric);
  EXPECT_TRUE(up.actorder);
  EXPECT_NE(up.rule.find("group_1"), std::string::npos) << up.rule;
  EXPECT_EQ(c.scheme_for("lm_head").kind, Kind::kUnquantized);
  EXPECT_EQ(c.scheme_for("model.layers.0.mlp.down_proj").kind, Kind::kUnquantized);
  EXPECT_NE(c.scheme_for("model.layers.0.mlp.down_proj").rule.find("ignore"), std::string::npos);
  // re.match anchors at the start only: the regex needs its own $ to stop at the end.
  EXPECT_EQ(c.scheme_for("model.layers.10.mlp.down_proj").kind, Kind::kInt);
}

TEST(QuantConfig, CompressedTensorsRegexTargetsOnly) {
  const QuantConfig c = QuantConfig::parse(R"({
    "quant_method": "compressed-tensors",
    "config_groups": {
      "a": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "int",
            "strategy": "channel"}},
      "b": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 4, "type": "float",
            "strategy": "tensor_group", "group_size": 16}},
      "c": {"targets": ["model.layers.0.mlp.gate"], "weights": {"num_bits": 8, "type": "float",
            "strategy": "tensor"}}
    }
  })",
                                           no_dir());
  EXPECT_EQ(c.scheme_for("model.layers.3.self_attn.o_proj").bits, 8);
  EXPECT_EQ(c.scheme_for("model.layers.3.mlp.down_proj").kind, Kind::kNvfp4);
  EXPECT_EQ(c.scheme_for("model.layers.0.mlp.gate").kind, Kind::kFloat8)
      << "a plain name sorts before every regex, whatever its group";
  EXPECT_EQ(c.scheme_for("lm_head").kind, Kind::kUnquantized);
}

TEST(QuantConfig, ModelOptGlobsCoverSubtrees) {
  const QuantConfig c = QuantConfig::parse(R"({
    "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
    "exclude_modules": ["lm_head", "model.layers.1.mlp*", "*.self_attn.[kv]_proj"]
  })",
                                           no_dir());
  EXPECT_EQ(c.dialect(), QuantDialect::kModelOpt);
  EXPECT_EQ(c.scheme_for("model.layers.0.mlp.up_proj").kind, Kind::kNvfp4);
  EXPECT_EQ(c.scheme_for("model.layers.1.mlp.up_proj").kind, Kind::kUnquantized);
  EXPECT_EQ(c.scheme_for("model.layers.1.mlp.experts.3.down_proj").kind, Kind::kUnquantized);
  EXPECT_EQ(c.scheme_for("model.layers.11.mlp.up_proj").kind, Kind::kNvfp4);
  EXPECT_EQ(c.scheme_for("model.layers.0.self_attn.k_proj").kind, Kind::kUnquantized);
  EXPECT_EQ(c.scheme_for("model.layers.0.self_attn.q_proj").kind, Kind::kNvfp4);
  EXPECT_EQ(c.scheme_for("lm_head").kind, Kind::kUnquantized);
}

TEST(QuantConfig, ModelOptLegacyFile) {
  const auto dir = std::filesystem::temp_directory_path() / "metrale-quant-legacy";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "hf_quant_config.json")
      << R"({"producer": {"name": "modelopt", "version": "0.47.0"},
             "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": null,
                              "exclude_modules": ["lm_head"]}})";
  const QuantConfig c = QuantConfig::parse("", dir);
  EXPECT_EQ(c.method(), "modelopt");
  EXPECT_EQ(c.source(), "hf_quant_config.json");
  EXPECT_EQ(c.scheme_for("model.layers.0.mlp.up_proj").kind, Kind::kFloat8);
  EXPECT_EQ(c.scheme_for("lm_head").kind, Kind::kUnquantized);
  std::filesystem::remove_all(dir);
}

TEST(QuantConfig, Fp8ModulePathsAsTransformersReadsThem) {
  const QuantConfig c = QuantConfig::parse(R"({
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
    "modules_to_not_convert": ["lm_head", "model.layers.1", "mlp.gate"]
  })",
                                           no_dir());
  EXPECT_EQ(c.dialect(), QuantDialect::kFp8Block);
  const ModuleScheme s = c.scheme_for("model.layers.0.mlp.up_proj");
  EXPECT_EQ(s.kind, Kind::kFloat8);
  ASSERT_EQ(s.block.size(), 2u);
  EXPECT_EQ(s.block[0], 128);
  EXPECT_EQ(c.scheme_for("model.layers.1.mlp.up_proj").kind, Kind::kUnquantized);
  EXPECT_EQ(c.scheme_for("model.layers.11.mlp.up_proj").kind, Kind::kFloat8)
      << "a path covers its subtree up to a module boundary, not layer 11";
  EXPECT_EQ(c.scheme_for("model.layers.3.mlp.gate").kind, Kind::kUnquantized);
  EXPECT_EQ(c.scheme_for("model.layers.3.mlp.gate_proj").kind, Kind::kFloat8);
  EXPECT_EQ(c.scheme_for("lm_head").kind, Kind::kUnquantized);
}

// DeepSeek-V3's FP8 release has no modules_to_not_convert; transformers then keeps the output
// embedding unquantized (get_keys_to_not_convert), and only then.
TEST(QuantConfig, Fp8WithoutExclusionsKeepsTheHeadUnquantized) {
  const QuantConfig c = QuantConfig::parse(R"({
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
    "weight_block_size": [128, 128]})",
                                           no_dir());
  const ModuleScheme head = c.scheme_for("lm_head");
  EXPECT_EQ(head.kind, Kind::kUnquantized);
  EXPECT_NE(head.rule.find("no modules_to_not_convert"), std::string::npos) << head.rule;
  EXPECT_EQ(c.scheme_for("model.layers.0.self_attn.kv_b_proj").kind, Kind::kFloat8);
  const QuantConfig listed = QuantConfig::parse(R"({
    "quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": []})",
                                                no_dir());
  EXPECT_EQ(listed.scheme_for("lm_head").kind, Kind::kFloat8);
}

TEST(QuantConfig, RefusesMalformedEntriesNamingTheField) {
  EXPECT_NE(parse_error(R"({"quant_method": "compressed-tensors", "config_groups": {"g": {
      "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
      "group_size": 128}}}, "ignore": ["re:(unclosed"]})")
                .find("ignore[0]"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "compressed-tensors", "config_groups": {"g": {
      "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
      "group_size": 128}}}, "ignore": [""]})")
                .find("empty entry"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "compressed-tensors", "config_groups": {"g": {
      "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
      "group_size": 128}}}, "ignore": [7]})")
                .find("ignore[0]"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "compressed-tensors", "config_groups": {"g": {
      "targets": ["Linear"], "weights": {"num_bits": 3, "type": "int"}}}})")
                .find("num_bits"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "compressed-tensors", "config_groups": {"g": {
      "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}})")
                .find("group_size"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "compressed-tensors", "config_groups": {"g": {
      "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
      "strategy": "diagonal"}}}})")
                .find("strategy"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "modelopt", "quant_algo": "NVFP4",
                            "exclude_modules": ["model.layers.[1"]})")
                .find("exclude_modules[0]"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"})")
                .find("not supported"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "fp8", "weight_block_size": [128],
                            "modules_to_not_convert": []})")
                .find("weight_block_size"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "fp8", "modules_to_not_convert": ["a(b"]})")
                .find("modules_to_not_convert[0]"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"quant_method": "gptq", "bits": 4})").find("\"gptq\" is not supported"),
            std::string::npos);
}

TEST(Fnmatch, MatchesPythonFnmatchcase) {
  EXPECT_TRUE(fnmatch("lm_head", "lm_head"));
  EXPECT_FALSE(fnmatch("lm_head", "lm_head2"));
  EXPECT_TRUE(fnmatch("model.layers.1.mlp*", "model.layers.1.mlp.experts.0.up_proj"));
  EXPECT_FALSE(fnmatch("model.layers.1.mlp*", "model.layers.10.mlp"));
  EXPECT_TRUE(fnmatch("*self_attn*", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(fnmatch("model.layers.?.mlp", "model.layers.7.mlp"));
  EXPECT_FALSE(fnmatch("model.layers.?.mlp", "model.layers.17.mlp"));
  EXPECT_TRUE(fnmatch("*.[kv]_proj", "a.k_proj"));
  EXPECT_FALSE(fnmatch("*.[!kv]_proj", "a.k_proj"));
  EXPECT_TRUE(fnmatch("*.[!kv]_proj", "a.q_proj"));
  EXPECT_TRUE(fnmatch("*.[a-c]", "x.b"));
  EXPECT_TRUE(fnmatch("*", ""));
  EXPECT_TRUE(fnmatch("a*b*c", "axxbyyc"));
  EXPECT_FALSE(fnmatch("a*b*c", "axxbyy"));
}

}  // namespace
}  // namespace metrale
