// `metrale embed`, run as the built binary, on the embedding fixtures: the JSON form equals
// sentence-transformers' reference (1e-5), the plain form prints the same values, --ids
// equals the text's ids, --dimensions cuts (and renormalises), --input-file's lines are inputs
// after the TEXTs, --rounds reports its timing beside unchanged output, bad arguments are
// refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
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

// A file in the test's temporary directory holding `text`; removed by the caller's scope.
std::string write_temp(const std::string& name, const std::string& text) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                  ("metrale_embed_test_" + std::to_string(::getpid()) + name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

TEST(EmbedCli, InputFileLinesFollowTheTextsAndRoundsKeepTheOutput) {
  const nlohmann::json ref = reference();
  // The texts with a newline go on the command line, the others into the file (one line each,
  // CRLF after the first, no newline after the last); the output follows that order.
  std::vector<std::string> args = {"--model", kDir, "--json", "--rounds", "3"};
  std::vector<size_t> order, in_file;
  for (size_t i = 0; i < ref["texts"].size(); ++i) {
    const std::string t = ref["texts"][i].get<std::string>();
    if (t.find('\n') != std::string::npos) {
      args.push_back(t);
      order.push_back(i);
    } else {
      in_file.push_back(i);
    }
  }
  ASSERT_GE(in_file.size(), 2u);
  std::string lines;
  for (size_t k = 0; k < in_file.size(); ++k) {
    lines += ref["texts"][in_file[k]].get<std::string>();
    lines += k == 0 ? "\r\n" : k + 1 < in_file.size() ? "\n" : "";
  }
  order.insert(order.end(), in_file.begin(), in_file.end());
  const std::string file = write_temp("inputs.txt", lines);
  args.insert(args.begin() + 3, {"--input-file", file});
  const CliRun r = run_metrale("embed", args, false);
  std::filesystem::remove(file);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["data"].size(), order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    EXPECT_EQ(j["data"][k]["tokens"], ref["ids"][order[k]].size()) << k;
    EXPECT_LT(gap(j["data"][k]["embedding"], ref["embeddings"][order[k]]), 1e-5f) << k;
  }
  const nlohmann::json& t = j["timing"];
  ASSERT_EQ(t["rounds_s"].size(), 3u);
  size_t tokens = 0;
  for (const auto& ids : ref["ids"]) tokens += ids.size();
  EXPECT_EQ(t["tokens"], tokens);
  const double med = t["median_s"].get<double>();
  EXPECT_GT(med, 0.0);
  EXPECT_NEAR(t["inputs_per_s"].get<double>(), static_cast<double>(ref["texts"].size()) / med,
              1e-9 * static_cast<double>(ref["texts"].size()) / med);
  EXPECT_GE(t["threads"].get<int>(), 1);
}

TEST(EmbedCli, BadInputFilesAreRefused) {
  const std::string blank = write_temp("blank.txt", "first\n\nthird\n");
  const CliRun r = run_metrale("embed", {"--model", kDir, "--input-file", blank});
  std::filesystem::remove(blank);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--input-file " + blank + ": line 2 is empty"), std::string::npos) << r.out;
  const CliRun missing =
      run_metrale("embed", {"--model", kDir, "--input-file", "/nonexistent/inputs.txt"});
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.out.find("--input-file /nonexistent/inputs.txt: cannot be opened"),
            std::string::npos)
      << missing.out;
  const std::string ids = write_temp("ids.txt", "1,2\n3,x\n");
  const CliRun bad_id = run_metrale("embed", {"--model", kDir, "--ids", "--input-file", ids});
  std::filesystem::remove(ids);
  EXPECT_EQ(bad_id.status, 1);
  EXPECT_NE(bad_id.out.find("--input-file " + ids + " line 2 (--ids): item 2 'x'"),
            std::string::npos)
      << bad_id.out;
  const CliRun rounds = run_metrale("embed", {"--model", kDir, "--rounds", "0", "x"});
  EXPECT_NE(rounds.status, 0);
  EXPECT_NE(rounds.out.find("--rounds"), std::string::npos) << rounds.out;
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
