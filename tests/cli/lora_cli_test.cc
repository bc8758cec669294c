// The LoRA flags as a user runs them: `metrale generate --lora NAME=DIR --adapter NAME` prints
// PEFT's greedy continuation; `metrale lora audit` reports an adapter or names its problem.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "engine/fixture_util.h"

namespace metrale {
namespace {

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "\"ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

const std::string kCase = "lora/qwen3_dense";

TEST(LoraCli, GenerateWithAnAdapterPrintsPeftsGreedyIds) {
  const testing::Reference ref(kCase);
  const std::string dir = testing::fixture_dir(kCase);
  for (const std::string adapter : {"a", "c", ""}) {
    std::vector<std::string> args = {"--model",      testing::fixture_dir("qwen3_f32"),
                                     "--ids",        join(ref.ids("input_ids")),
                                     "-n",           "16",
                                     "--ignore-eos", "--json",
                                     "--threads",    "2",
                                     "--lora",       "a=" + dir + "/a",
                                     "--lora",       "c=" + dir + "/c",
                                     "--lora-dtype", "f32"};
    if (!adapter.empty()) {
      args.push_back("--adapter");
      args.push_back(adapter);
    }
    const CliRun r = run_metrale("generate", args, /*with_stderr=*/false);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(ids_json(ref.ids((adapter.empty() ? "base" : adapter) + ".greedy_ids"))),
              std::string::npos)
        << "adapter '" << adapter << "': " << r.out;
  }
}

TEST(LoraCli, AuditReportsAndRefuses) {
  const std::string dir = testing::fixture_dir(kCase);
  CliRun r =
      run_metrale("lora", {"audit", dir + "/c", "--model", testing::fixture_dir("qwen3_f32")});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("model.layers.1.self_attn.o_proj: rank 2, alpha 16, scale 8"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("model.layers.0.self_attn.q_proj: rank 16, alpha 32, scale 2"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("OK"), std::string::npos) << r.out;
  // The same adapter against a model of another shape: refused, naming the tensor.
  r = run_metrale("lora", {"audit", dir + "/c", "--model", testing::fixture_dir("qwen2_f32")});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("metrale: error:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("has shape"), std::string::npos) << r.out;
  // Flag errors.
  r = run_metrale("generate", {"--model", testing::fixture_dir("qwen3_f32"), "--ids", "1,2",
                               "--lora", "nodir"});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("expected NAME=DIR"), std::string::npos) << r.out;
  r = run_metrale("generate", {"--model", testing::fixture_dir("qwen3_f32"), "--ids", "1,2",
                               "--lora", "a=" + dir + "/a", "--adapter", "zz"});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("--adapter zz: no --lora of that name"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace metrale
