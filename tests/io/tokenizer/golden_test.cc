// Every corpus case, on every tokenizer variant, against the ids and decodes that the Python
// `tokenizers` package produced (tools/fixtures/tokenizer/make_tokenizer_fixtures.py).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include "gzip_file.h"
#include "io/tokenizer/tokenizer.h"

namespace metrale {
namespace {

using Json = nlohmann::json;
constexpr const char* kDir = "tests/data/tokenizers/";

const Json& golden() {
  static const Json j = Json::parse(testing::read_gzip_file(std::string(kDir) + "golden.json.gz"));
  return j;
}

const Json& base_json(const std::string& name) {
  static std::map<std::string, Json> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  std::string text;
  if (name == "sp_bpe") {
    std::ifstream in(std::string(kDir) + "sp_bpe/tokenizer.json", std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  } else {
    text = testing::read_gzip_file(std::string(kDir) + name + "/tokenizer.json.gz");
  }
  return cache.emplace(name, Json::parse(text)).first->second;
}

// Mirrors apply_patch() of the fixture script.
std::string patched(const Json& base, const Json& patch) {
  Json j = base;
  if (patch.contains("replace"))
    for (auto& [k, v] : patch["replace"].items()) j[k] = v;
  if (patch.contains("model_replace"))
    for (auto& [k, v] : patch["model_replace"].items()) j["model"][k] = v;
  if (patch.value("legacy_merges", false)) {
    for (Json& m : j["model"]["merges"])
      if (m.is_array()) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  }
  if (patch.contains("added_tokens_update")) {
    for (const Json& t : patch["added_tokens_update"])
      for (Json& a : j["added_tokens"])
        if (a["content"] == t["content"]) a.update(t);
  }
  if (patch.contains("added_tokens_append"))
    for (const Json& t : patch["added_tokens_append"]) j["added_tokens"].push_back(t);
  return j.dump();
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// Built once per variant: parsing a 150k-entry vocabulary dominates a Debug test run.
const Tokenizer& variant(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const Json& v = golden()["variants"][name];
  return cache.emplace(name, Tokenizer::from_json(patched(base_json(v["base"]), v["patch"]), name))
      .first->second;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesTokenizersOnEveryCase) {
  const Json& v = golden()["variants"][GetParam()];
  ASSERT_FALSE(v.is_null()) << GetParam();
  const Tokenizer& tok = variant(GetParam());
  const Json& cases = golden()["cases"];
  const Json& results = v["results"];
  ASSERT_EQ(cases.size(), results.size());
  ASSERT_GT(cases.size(), 300u);
  int failures = 0;
  for (size_t i = 0; i < cases.size() && failures < 10; ++i) {
    const std::string text = from_hex(cases[i]["hex"]);
    const std::string name = cases[i]["name"];
    const auto ids = tok.encode(text, false);
    const auto ids_special = tok.encode(text, true);
    const bool ok = ids == results[i]["ids"].get<std::vector<int32_t>>() &&
                    ids_special == results[i]["ids_special"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, results[i]["ids"].get<std::vector<int32_t>>()) << name;
    EXPECT_EQ(ids_special, results[i]["ids_special"].get<std::vector<int32_t>>()) << name;
    const auto expected_special = results[i]["ids_special"].get<std::vector<int32_t>>();
    const std::string decoded = tok.decode(expected_special, false);
    const std::string decoded_skip = tok.decode(expected_special, true);
    EXPECT_EQ(decoded, results[i]["decoded"].get<std::string>()) << name;
    EXPECT_EQ(decoded_skip, results[i]["decoded_skip"].get<std::string>()) << name;
    if (!ok || decoded != results[i]["decoded"] || decoded_skip != results[i]["decoded_skip"])
      ++failures;
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(Golden, VocabularyFactsMatch) {
  const Json& v = golden()["variants"][GetParam()];
  const Tokenizer& tok = variant(GetParam());
  EXPECT_EQ(tok.vocab_size(), v["vocab_size"].get<size_t>());
  for (const Json& e : v["id_to_token"]) {
    const auto id = e[0].get<int32_t>();
    if (e[1].is_null()) {
      EXPECT_FALSE(tok.id_to_token(id).has_value()) << id;
    } else {
      EXPECT_EQ(tok.id_to_token(id), e[1].get<std::string>()) << id;
      EXPECT_EQ(tok.token_to_id(e[1].get<std::string>()), id) << id;
    }
  }
  for (const Json& e : v["added"]) {
    const auto id = tok.token_to_id(e[0].get<std::string>());
    ASSERT_TRUE(id.has_value()) << e[0];
    EXPECT_EQ(*id, e[1].get<int32_t>()) << e[0];
    EXPECT_EQ(tok.is_special(*id), e[2].get<bool>()) << e[0];
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Golden,
                         ::testing::Values("qwen3", "deepseek_v3", "qwen3_gpt2", "qwen3_splits",
                                           "qwen3_contiguous", "sp_bpe", "sp_llama", "sp_always"));

}  // namespace
}  // namespace metrale
