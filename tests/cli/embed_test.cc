// `metrale embed`, run as the built binary, on the embedding fixtures: the JSON form equals
// sentence-transformers' reference (1e-5), the plain form prints the same values, --ids
// equals the text's ids, --dimensions cuts (and renormalises), bad arguments are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace metrale {
namespace {

const std::string kDir = "tests/data/fixtures/embedding/lasttoken";

nlohmann::json reference() {
  std::ifstream in(kDir + "/reference.json");
  return nlohmann::json::parse(in);
}

float gap(const nlohmann::json& got, const nlohmann::json& want) {
  float g = 0;
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    g = std::max(g, std::abs(got[i].get<float>() - want[i].get<float>()));
  return g;
}

TEST(EmbedCli, JsonEqualsTheReference) {
  const nlohmann::json ref = reference();
  std::vector<std::string> args = {"--model", kDir, "--json"};
  for (const auto& t : ref["texts"]) args.push_back(t.get<std::string>());
  const CliRun r = run_metrale("embed", args, false);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["pooling"], "lasttoken");
  EXPECT_EQ(j["normalize"], true);
  EXPECT_EQ(j["dimensions"], 32);
  ASSERT_EQ(j["data"].size(), ref["texts"].size());
  for (size_t i = 0; i < j["data"].size(); ++i) {
    EXPECT_EQ(j["data"][i]["index"], i);
    EXPECT_EQ(j["data"][i]["tokens"], ref["ids"][i].size());
    EXPECT_LT(gap(j["data"][i]["embedding"], ref["embeddings"][i]), 1e-5f) << i;
  }
  args.insert(args.begin() + 3, {"--dimensions", "8"});
  const CliRun cut = run_metrale("embed", args, false);
  ASSERT_EQ(cut.status, 0) << cut.out;
  const nlohmann::json c = nlohmann::json::parse(cut.out);
  for (size_t i = 0; i < c["data"].size(); ++i)
    EXPECT_LT(gap(c["data"][i]["embedding"], ref["embeddings_dimensions"][i]), 1e-5f) << i;
}

TEST(EmbedCli, PlainOutputAndIdsAgree) {
  const nlohmann::json ref = reference();
  const std::string text = ref["texts"][1].get<std::string>();
  std::string ids;
  for (const auto& id : ref["ids"][1])
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  const CliRun plain = run_metrale("embed", {"--model", kDir, text}, false);
  const CliRun by_ids = run_metrale("embed", {"--model", kDir, "--ids", ids}, false);
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_EQ(plain.out, by_ids.out);
  std::istringstream in(plain.out);
  std::vector<float> values;
  for (float v = 0; in >> v;) values.push_back(v);
  ASSERT_EQ(values.size(), 32u);
  const CliRun json = run_metrale("embed", {"--model", kDir, "--json", text}, false);
  const nlohmann::json e = nlohmann::json::parse(json.out)["data"][0]["embedding"];
  for (size_t c = 0; c < values.size(); ++c)
    EXPECT_EQ(values[c], e[c].get<float>()) << c;  // %.9g is exact
}

TEST(EmbedCli, BadArgumentsAreRefused) {
  const CliRun dims = run_metrale("embed", {"--model", kDir, "--dimensions", "33", "x"});
  EXPECT_EQ(dims.status, 1);
  EXPECT_NE(dims.out.find("dimensions 33 is outside [1, 32]"), std::string::npos) << dims.out;
  const CliRun ids = run_metrale("embed", {"--model", kDir, "--ids", "1,x"});
  EXPECT_EQ(ids.status, 1);
  EXPECT_NE(ids.out.find("TEXT 1 (--ids): item 2 'x' is not an integer"), std::string::npos)
      << ids.out;
  const CliRun vocab = run_metrale("embed", {"--model", kDir, "--ids", "5,99999"});
  EXPECT_EQ(vocab.status, 1);
  EXPECT_NE(vocab.out.find("input 0: token 1 is 99999, outside the vocabulary"), std::string::npos)
      << vocab.out;
  const CliRun none = run_metrale("embed", {"--model", kDir});
  EXPECT_NE(none.status, 0);
  const CliRun long_text = run_metrale("embed", {"--model", kDir, std::string(200, 'a')});
  EXPECT_EQ(long_text.status, 1);
  EXPECT_NE(long_text.out.find("at most 128 fit (sentence_bert_config.json's max_seq_length)"),
            std::string::npos)
      << long_text.out;
}

}  // namespace
}  // namespace metrale
