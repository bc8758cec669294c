// Bad input to the engine: clear errors naming what is wrong, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint_copy.h"
#include "core/error.h"
#include "engine/session.h"
#include "fixture_util.h"
#include "io/safetensors/writer.h"
#include "support/test_support.h"

namespace metrale {
namespace {

namespace fs = std::filesystem;

using test::error_of;

using testing::CheckpointCopy;

LoadOptions small() { return testing::small_load_options(); }

TEST(EngineBadInput, TokenIdOutOfRange) {
  auto m = Model::load(testing::fixture_dir("qwen3_f32"), small());
  std::vector<float> logits(static_cast<size_t>(m->vocab_size()));
  Sequence s;
  const std::vector<int32_t> ids = {1, 2, 392};
  const std::string msg = error_of([&] { m->prefill(s, ids, logits); });
  EXPECT_NE(msg.find("token id 392 at index 2 is outside the vocabulary [0, 392)"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(s.tokens.empty());
  const std::vector<int32_t> negative = {-1};
  EXPECT_NE(error_of([&] { m->prefill(s, negative, logits); }).find("token id -1"),
            std::string::npos);
}

TEST(EngineBadInput, PromptLongerThanContext) {
  auto m = Model::load(testing::fixture_dir("qwen3_f32"), small());
  std::vector<float> logits(static_cast<size_t>(m->vocab_size()));
  Sequence s;
  const std::vector<int32_t> ids(40, 5);
  const std::string msg = error_of([&] { m->prefill(s, ids, logits); });
  EXPECT_NE(msg.find("exceeds the context of 32 tokens"), std::string::npos) << msg;
  // Generation stops cleanly when the context fills up.
  Session session(*m);
  const std::vector<int32_t> prompt(30, 5);
  const GenerateResult r = session.generate(prompt, {.max_new_tokens = 10, .ignore_eos = true});
  EXPECT_EQ(r.stop, StopReason::kContextFull);
  EXPECT_EQ(r.tokens.size(), 3u);
}

TEST(EngineBadInput, MissingTensor) {
  CheckpointCopy c("qwen3_f32");
  c.rewrite([](const std::string& n) { return n != "model.layers.1.mlp.up_proj.weight"; });
  const std::string msg = error_of([&] { Model::load(c.dir(), small()); });
  EXPECT_NE(
      msg.find("missing tensor 'model.layers.1.mlp.up_proj.weight' (expected shape [160, 64])"),
      std::string::npos)
      << msg;
}

TEST(EngineBadInput, UnexpectedTensor) {
  CheckpointCopy c("qwen3_f32");
  c.rewrite([](const std::string&) { return true; }, /*add_extra=*/true);
  const std::string msg = error_of([&] { Model::load(c.dir(), small()); });
  EXPECT_NE(msg.find("'model.layers.0.mlp.extra.weight'"), std::string::npos) << msg;
}

TEST(EngineBadInput, ConfigContradictsTensors) {
  CheckpointCopy c("qwen3_f32");
  c.replace_in_config("\"intermediate_size\": 160", "\"intermediate_size\": 128");
  const std::string msg = error_of([&] { Model::load(c.dir(), small()); });
  EXPECT_NE(msg.find("has shape [160, 64], expected [128, 64]"), std::string::npos) << msg;
}

TEST(EngineBadInput, MissingFiles) {
  CheckpointCopy c("qwen3_f32");
  fs::remove(c.dir() / "model.safetensors");
  EXPECT_NE(error_of([&] { Model::load(c.dir(), small()); }).find(c.dir().string()),
            std::string::npos);
  fs::remove(c.dir() / "config.json");
  EXPECT_NE(error_of([&] { Model::load(c.dir(), small()); }).find("config.json"),
            std::string::npos);
}

TEST(EngineBadInput, DecodeArguments) {
  auto m = Model::load(testing::fixture_dir("qwen3_f32"), small());
  const auto V = static_cast<size_t>(m->vocab_size());
  std::vector<float> logits(2 * V);
  Sequence s;
  const std::vector<int32_t> p = {1, 2};
  m->prefill(s, p, std::span(logits).first(V));
  Sequence* twice[] = {&s, &s};
  const int32_t tokens[] = {3, 4};
  EXPECT_NE(error_of([&] { m->decode(twice, tokens, logits); }).find("appears twice"),
            std::string::npos);
  m->release(s);
}

}  // namespace
}  // namespace metrale
