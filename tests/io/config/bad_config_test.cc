// Broken configs must fail with a metrale::Error naming the file, the field and what was
// expected versus found: never a crash, a nlohmann exception or a silently defaulted value.
#include <string>

#include "config_test_util.h"

namespace metrale {
namespace {

using nlohmann::json;

std::string bad_path(const std::string& name) {
  return std::string(test::kConfigsDir) + "/bad/" + name;
}

TEST(BadConfig, EditedRealConfigsFailNamingTheField) {
  json cases = test::read_json(bad_path("cases.json"))["cases"];
  ASSERT_GE(cases.size(), 50u);
  for (const json& c : cases) {
    std::string name = c["name"];
    SCOPED_TRACE(name);
    std::string base = std::string(test::kConfigsDir) + "/" + c["base"].get<std::string>();
    json doc = test::apply_variant(test::read_json(base + "/config.json"), c);
    std::string source = "/ckpt/" + name + "/config.json";
    std::string msg = test::error_of([&] { parse_model_config(doc.dump(), source); });
    EXPECT_EQ(0u, msg.find(source)) << "message must start with the file: " << msg;
    for (const json& piece : c["expect"]) {
      EXPECT_NE(msg.find(piece.get<std::string>()), std::string::npos)
          << "missing '" << piece << "' in: " << msg;
    }
  }
}

TEST(BadConfig, UnparseableFilesFailNamingTheFile) {
  for (const char* name : {"truncated.json", "malformed.json", "empty.json"}) {
    SCOPED_TRACE(name);
    std::string text = test::read_text(bad_path(name));
    std::string msg = test::error_of([&] { parse_model_config(text, bad_path(name)); });
    EXPECT_NE(msg.find(bad_path(name) + ": malformed JSON"), std::string::npos) << msg;
  }
  std::string msg = test::error_of([&] {
    parse_model_config(test::read_text(bad_path("not_an_object.json")), "not_an_object.json");
  });
  EXPECT_NE(msg.find("not_an_object.json: expected a JSON object at the top level, found array"),
            std::string::npos)
      << msg;
}

TEST(BadConfig, BrokenGenerationConfigNamesThatFile) {
  std::string config = test::read_text(std::string(test::kConfigsDir) + "/qwen3/config.json");
  std::string msg = test::error_of(
      [&] { parse_model_config(config, "config.json", "{\"eos_token_id\": [1, -5]}", "g.json"); });
  EXPECT_NE(msg.find("g.json: field 'eos_token_id'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found -5"), std::string::npos) << msg;
  msg = test::error_of(
      [&] { parse_model_config(config, "config.json", "{\"eos_token_id\": 7", "g.json"); });
  EXPECT_NE(msg.find("g.json: malformed JSON"), std::string::npos) << msg;
  msg = test::error_of(
      [&] { parse_model_config(config, "config.json", "{\"eos_token_id\": \"7\"}", "g.json"); });
  EXPECT_NE(msg.find("expected an integer, found string \"7\""), std::string::npos) << msg;
}

// A deeply nested value in a field the error message quotes used to overflow the stack in
// nlohmann's recursive dump (fuzz/model_config_fuzz); nesting is now refused while parsing.
TEST(BadConfig, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string msg =
      test::error_of([&] { parse_model_config("{\"model_type\": " + deep + "}", "deep.json"); });
  EXPECT_EQ(0u, msg.find("deep.json: JSON nesting deeper than")) << msg;
}

// Every prefix of a real config is either valid JSON (the whole file) or a clean Error: the
// parser never crashes or throws anything else on truncated input.
TEST(BadConfig, EveryTruncationIsAnErrorNotACrash) {
  std::string text = test::read_text(std::string(test::kConfigsDir) + "/deepseek_v3/config.json");
  for (size_t n = 0; n + 2 < text.size(); n += 7) {
    try {
      parse_model_config(std::string_view(text).substr(0, n), "cut.json");
      ADD_FAILURE() << "a " << n << "-byte prefix parsed";
    } catch (const Error& e) {
      EXPECT_EQ(0u, e.message().find("cut.json: ")) << e.message();
    }
  }
}

}  // namespace
}  // namespace metrale
