// The shipped demo checkpoints against transformers: the tokenizer's prompt ids, the greedy
// continuation (stopping at eos like HF's generate) and its text, as recorded by
// tools/demo/train_demo.py in tests/data/demo/reference.json (models/demo) and by
// tools/demo/train_demo_mtp.py in tests/data/demo_mtp/reference.json (models/demo_mtp: the
// target without its MTP layer, which transformers drops), and by tools/demo/train_demo_copy.py
// in tests/data/demo_copy/reference.json (models/demo_copy).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/session.h"

namespace metrale {
namespace {

class DemoCheckpoint : public ::testing::TestWithParam<const char*> {};

TEST_P(DemoCheckpoint, GreedyOutputEqualsTransformers) {
  const std::string name = GetParam();
  const std::string path = "tests/data/" + name + "/reference.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const nlohmann::json ref = nlohmann::json::parse(in);
  LoadOptions o;
  o.n_threads = 2;
  auto model = Model::load("models/" + name, o);
  ASSERT_NE(model->tokenizer(), nullptr);
  const Tokenizer& tok = *model->tokenizer();
  const auto max_new = ref.at("max_new_tokens").get<int64_t>();
  const auto eos = ref.at("eos_token_id").get<int32_t>();
  ASSERT_FALSE(ref.at("cases").empty());
  for (const auto& c : ref.at("cases")) {
    const auto prompt = c.at("prompt").get<std::string>();
    const auto want_prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto want = c.at("greedy_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(prompt, true), want_prompt) << prompt;

    Session session(*model);
    const GenerateResult r = session.generate(want_prompt, {.max_new_tokens = max_new});
    // HF's output keeps the eos that ended it; ours reports it as the stop reason.
    std::vector<int32_t> got = r.tokens;
    if (r.stop == StopReason::kEos) got.push_back(eos);
    EXPECT_EQ(got, want) << prompt;
    EXPECT_EQ(tok.decode(got, /*skip_special_tokens=*/false), c.at("text").get<std::string>())
        << prompt;
    EXPECT_FALSE(r.text.empty()) << prompt;
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, DemoCheckpoint,
                         ::testing::Values("demo", "demo_mtp", "demo_copy"));

}  // namespace
}  // namespace metrale
