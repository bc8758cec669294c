// `metrale generate --json`, run as the built binary: the ids it prints are the library's greedy
// continuation, equal to HF's on a hybrid fixture (what bench/compare compares engines with).
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "engine/fixture_util.h"
#include "io/safetensors/file.h"

namespace metrale {
namespace {

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// The integers of the JSON array after `"key": [` in `line`.
std::vector<int32_t> array_of(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\": [");
  EXPECT_NE(at, std::string::npos) << key << " not in: " << line;
  if (at == std::string::npos) return {};
  std::istringstream in(line.substr(line.find('[', at) + 1));
  std::vector<int32_t> ids;
  int32_t v = 0;
  char sep = 0;
  while (in >> v) {
    ids.push_back(v);
    if (!(in >> sep) || sep == ']') break;
  }
  return ids;
}

TEST(GenerateJson, PrintsTheGreedyIdsHfGives) {
  for (const std::string fixture : {"qwen3_next_f32", "qwen3_5_moe_f32", "qwen3_f32"}) {
    const testing::Reference ref(fixture);
    const std::vector<int32_t> prompt = ref.ids("input_ids_b");
    const CliRun r =
        run_metrale("generate",
                    {"--model", testing::fixture_dir(fixture), "--ids", join(prompt),
                     "--no-special", "-n", "16", "--ignore-eos", "--json", "--threads", "2"},
                    /*with_stderr=*/false);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(array_of(r.out, "prompt_ids"), prompt) << fixture;
    EXPECT_EQ(array_of(r.out, "ids"), ref.ids("greedy_ids_b")) << fixture;
    EXPECT_NE(r.out.find("\"stop\": \"max tokens\""), std::string::npos) << r.out;
  }
}

// The integer after `"key": ` in `line` (-1 when absent).
long long integer_of(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\": ");
  if (at == std::string::npos) return -1;
  return std::stoll(line.substr(at + key.size() + 4));
}

// --speculative ngram prints the same ids, and how many drafts it fed and accepted.
TEST(GenerateJson, SpeculativeNgramKeepsTheIdsAndCountsItsDrafts) {
  const std::string fixture = testing::fixture_dir("qwen3_f32");
  const std::vector<std::string> common = {
      "--model", fixture,     "--ids", "7,7,7,7,7,7,7,7,7,7,7,7", "-n", "40", "--ignore-eos",
      "--json",  "--threads", "2"};
  const CliRun off = run_metrale("generate", common, /*with_stderr=*/false);
  std::vector<std::string> args = common;
  for (const char* a : {"--speculative", "ngram", "--draft-tokens", "3"}) args.emplace_back(a);
  const CliRun on = run_metrale("generate", args, /*with_stderr=*/false);
  ASSERT_EQ(off.status, 0) << off.out;
  ASSERT_EQ(on.status, 0) << on.out;
  EXPECT_EQ(array_of(on.out, "ids"), array_of(off.out, "ids"));
  EXPECT_EQ(array_of(on.out, "ids").size(), 40u);
  EXPECT_EQ(integer_of(off.out, "drafted"), 0) << off.out;
  EXPECT_EQ(integer_of(off.out, "accepted"), 0) << off.out;
  EXPECT_GT(integer_of(on.out, "accepted"), 0) << on.out;
  EXPECT_GE(integer_of(on.out, "drafted"), integer_of(on.out, "accepted")) << on.out;
}

// --speculative mtp: the checkpoint's MTP layer drafts; the ids are those of plain decoding.
TEST(GenerateJson, SpeculativeMtpKeepsTheIds) {
  const std::vector<std::string> base = {
      "--model",      testing::fixture_dir("deepseek_v3_mtp_bf16"),
      "--ids",        "5,9,5,9,5,9,5",
      "-n",           "24",
      "--ignore-eos", "--json"};
  std::vector<std::string> spec = base;
  for (const char* a : {"--speculative", "mtp", "--draft-tokens", "3"}) spec.push_back(a);
  const CliRun off = run_metrale("generate", base);
  const CliRun on = run_metrale("generate", spec);
  ASSERT_EQ(off.status, 0) << off.out;
  ASSERT_EQ(on.status, 0) << on.out;
  EXPECT_EQ(array_of(on.out, "ids"), array_of(off.out, "ids"));
  EXPECT_GT(integer_of(on.out, "drafted"), 0) << on.out;
}

// --draft-tree: n-gram drafts as a tree, verified at once; the ids are those of plain decoding,
// and the JSON counts what was drafted and accepted.
TEST(GenerateJson, ADraftTreeKeepsTheIds) {
  for (const char* fixture : {"qwen3_bf16", "qwen3_next_f32"}) {  // dense, hybrid
    const std::vector<std::string> base = {"--model",      testing::fixture_dir(fixture),
                                           "--ids",        "7,7,5,7,9,7,7,5,7,9,7,11,7,7",
                                           "-n",           "24",
                                           "--ignore-eos", "--json"};
    std::vector<std::string> spec = base;
    for (const char* a : {"--speculative", "ngram", "--draft-tree", "-1,-1,0,0,1,2"})
      spec.push_back(a);
    const CliRun off = run_metrale("generate", base);
    const CliRun on = run_metrale("generate", spec);
    ASSERT_EQ(off.status, 0) << off.out;
    ASSERT_EQ(on.status, 0) << on.out;
    EXPECT_EQ(array_of(on.out, "ids"), array_of(off.out, "ids")) << fixture;
    EXPECT_GT(integer_of(on.out, "drafted"), 0) << fixture << on.out;
  }
}

// Bad speculative flags: each a clear error naming the flag, before anything runs.
TEST(GenerateJson, BadSpeculativeFlagsNameTheFlag) {
  struct Case {
    std::string fixture;
    std::vector<std::string> flags;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"qwen3_f32",
       {"--speculative", "eagle"},
       "--speculative 'eagle': expected ngram, mtp or off"},
      {"qwen3_f32", {"--speculative", "mtp"}, "--speculative mtp: "},
      {"qwen3_f32", {"--speculative", "mtp"}, "has no MTP layers"},
      {"qwen3_f32",
       {"--speculative", "ngram", "--draft-ladder", "4:3,x"},
       "--draft-ladder: rung 2"},
      {"qwen3_f32", {"--speculative", "ngram", "--draft-tokens", "0"}, "--draft-tokens"},
      {"qwen3_f32", {"--speculative", "ngram", "--draft-tokens", "40"}, "--dispatch-cap"},
      {"qwen3_f32", {"--speculative", "ngram", "--dispatch-cap", "200"}, "--dispatch-cap"},
      {"qwen3_f32",
       {"--speculative", "ngram", "--ngram-min", "3", "--ngram-max", "2"},
       "--ngram-max"},
      {"qwen3_f32",
       {"--speculative", "ngram", "--draft-tree", "-1,0,x"},
       "--draft-tree: node 2: expected a parent index"},
      {"qwen3_f32",
       {"--speculative", "ngram", "--draft-tree", "-1,1"},
       "--draft-tree: node 1: parent must be -1 (the root) or an earlier node"},
      {"qwen3_f32",
       {"--speculative", "ngram", "--draft-tree", "chain:6"},
       "deeper than --draft-tokens 4"},
      {"qwen3_f32",
       {"--speculative", "ngram", "--draft-tree", "-1,-1,-1,-1,-1", "--dispatch-cap", "4"},
       "more than --dispatch-cap 4"},
      {"qwen3_f32",
       {"--speculative", "ngram", "--draft-tree", "-1,-1", "--draft-branch-p", "0.2"},
       "--draft-branch-p: applies to --speculative mtp with --draft-tree"},
      {"deepseek_v3_mtp_bf16",
       {"--speculative", "mtp", "--draft-tree", "-1,-1", "--draft-branch-p", "1.5"},
       "--draft-branch-p: expected a probability in [0, 1)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {
        "--model", testing::fixture_dir(c.fixture), "--ids", "1,2,3", "-n", "4"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const CliRun r = run_metrale("generate", args);
    EXPECT_NE(r.status, 0) << c.says;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
  }
}

// --image on the tiny Qwen2-VL: the file decoded and preprocessed by the checkpoint's processor
// config (the PIL resize transformers' reference ran), the one pad in --ids expanded to the
// image's 12 placeholders, and the 10 greedy tokens transformers' generate gave.
TEST(GenerateJson, AnImageThroughTheVisionTower) {
  const std::string dir = testing::fixture_dir("qwen2_vl_f32");
  const std::string image = "tests/data/vision/images/photo_chelsea.jpg";
  const CliRun r = run_metrale("generate",
                               {"--model", dir, "--ids", "1,5,17,252,250,253,33,9,120", "--image",
                                image, "-n", "10", "--ignore-eos", "--json", "--threads", "2"},
                               /*with_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  std::vector<int32_t> prompt = {1, 5, 17, 252};
  prompt.insert(prompt.end(), 12, 250);
  prompt.insert(prompt.end(), {253, 33, 9, 120});
  EXPECT_EQ(array_of(r.out, "prompt_ids"), prompt);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/tower.safetensors");
  const auto& t = ref.at("one_image.greedy");
  std::vector<int64_t> greedy(static_cast<size_t>(t.shape.numel()));
  std::memcpy(greedy.data(), ref.bytes(t).data(), greedy.size() * sizeof(int64_t));
  EXPECT_EQ(array_of(r.out, "ids"), std::vector<int32_t>(greedy.begin(), greedy.end()));
  // A text-only model refuses --image, naming it.
  const CliRun bad = run_metrale("generate", {"--model", testing::fixture_dir("qwen3_f32"), "--ids",
                                              "1,2", "--image", image, "-n", "1"});
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("cannot be used"), std::string::npos) << bad.out;
}

// --image on the tiny GLM-4V and GLM-4.5V (glm4v_fixtures.py): the chat text's <|image|>
// expanded as Glm4vProcessor expands it for the file as the checkpoint's Glm4vImageProcessorPil
// prepares it, and the 10 greedy tokens transformers' generate gave.
TEST(GenerateJson, AGlm4vImageThroughTheVisionTower) {
  for (const char* fixture : {"glm4v_f32", "glm4v_moe_f32"}) {
    SCOPED_TRACE(fixture);
    const std::string dir = testing::fixture_dir(fixture);
    const SafetensorsFile ref = SafetensorsFile::open(dir + "/tower.safetensors");
    auto ints = [&](const char* key) {
      const auto& t = ref.at(key);
      std::vector<int64_t> v(static_cast<size_t>(t.shape.numel()));
      std::memcpy(v.data(), ref.bytes(t).data(), v.size() * sizeof(int64_t));
      return std::vector<int32_t>(v.begin(), v.end());
    };
    const CliRun r =
        run_metrale("generate",
                    {"--model", dir, "--prompt", ref.metadata().at("one_image.text"),
                     "--no-special", "--image", "tests/data/vision/images/photo_chelsea.jpg", "-n",
                     "10", "--ignore-eos", "--json", "--threads", "2"},
                    /*with_stderr=*/false);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(array_of(r.out, "prompt_ids"), ints("one_image.ids"));
    EXPECT_EQ(array_of(r.out, "ids"), ints("one_image.greedy"));
  }
}

// --video on the tiny Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V and GLM-4.5V (anim.gif, decoded
// in-process): the prompt text with one video pad expanded as the processor expands it
// (Qwen3-VL / Qwen3.5: a "<t seconds>" before each frame; GLM: each frame's image tokens between
// <|begin_of_image|> and <|end_of_image|>, its integer second after) and the 10 greedy tokens
// transformers' generate gave (video.safetensors, tools/fixtures/models/vision_video_fixtures.py
// and glm4v_fixtures.py).
TEST(GenerateJson, AVideoThroughTheVisionTower) {
  for (const char* fixture :
       {"qwen2_5_vl_f32", "qwen3_vl_f32", "qwen3_5_vl_f32", "glm4v_f32", "glm4v_moe_f32"}) {
    SCOPED_TRACE(fixture);
    const std::string dir = testing::fixture_dir(fixture);
    const SafetensorsFile ref = SafetensorsFile::open(dir + "/video.safetensors");
    auto ints = [&](const char* key) {
      const auto& t = ref.at(key);
      std::vector<int64_t> v(static_cast<size_t>(t.shape.numel()));
      std::memcpy(v.data(), ref.bytes(t).data(), v.size() * sizeof(int64_t));
      return std::vector<int32_t>(v.begin(), v.end());
    };
    const CliRun r = run_metrale("generate",
                                 {"--model", dir, "--prompt", ref.metadata().at("text"),
                                  "--no-special", "--video", "tests/data/vision/images/anim.gif",
                                  "-n", "10", "--ignore-eos", "--json", "--threads", "2"},
                                 /*with_stderr=*/false);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(array_of(r.out, "prompt_ids"), ints("ids"));
    EXPECT_EQ(array_of(r.out, "ids"), ints("greedy"));
  }
}

}  // namespace
}  // namespace metrale
