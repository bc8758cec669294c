// Structured outputs in continuous batching: constrained and unconstrained streams share
// steps while their grammars' masks are filled ahead on the mask workers (beside the forward);
// every stream that runs to its end equals the same request run alone, whatever shares its
// steps and whichever streams are cancelled with a fill queued or running.
#include <gtest/gtest.h>

#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/session.h"
#include "grammar/grammar.h"
#include "serve/scheduler.h"
#include "stream_drain.h"

namespace metrale {
namespace {

using namespace std::chrono_literals;
using serve_test::drain;
using serve_test::Drained;
using serve_test::settled;

std::unique_ptr<Model> load_demo(int64_t kv_tokens) {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = kv_tokens;
  o.max_rows = 64;
  return Model::load("models/demo", o);
}

struct Case {
  std::string prompt;
  std::shared_ptr<const CompiledGrammar> grammar;  // null: unconstrained
  int64_t max_tokens;
  float temperature;
};

ServeRequest request_of(const Model& m, const Case& c, uint64_t seed) {
  ServeRequest r;
  r.prompt = m.tokenizer()->encode(c.prompt, /*add_special_tokens=*/false);
  r.max_tokens = c.max_tokens;
  r.sampling.temperature = c.temperature;
  r.seed = seed;
  r.grammar = c.grammar;
  r.ignore_eos = c.grammar == nullptr;  // the unconstrained streams run long
  return r;
}

std::string text_of(const Model& m, const std::vector<int32_t>& ids) {
  return m.tokenizer()->decode(ids, /*skip_special_tokens=*/true);
}

TEST(SchedulerGrammar, CoBatchedConstrainedStreamsEqualEachRunAloneWithCancellations) {
  if (!grammar_available()) GTEST_SKIP() << "built without xgrammar: structured outputs are off";
  // 8 KV pages of 16 tokens for 12 streams: requests wait for pages and slots, and join steps
  // already running.
  auto model = load_demo(/*kv_tokens=*/128);
  const Tokenizer& tok = *model->tokenizer();
  GrammarCompiler compiler(tok, model->vocab_size(), default_eos_ids(*model));
  const auto regex = compiler.compile(
      {.kind = GrammarSpec::Kind::kRegex, .text = "[A-Z][a-z]+( [a-z]+){2,6}\\.", .field = "r"});
  const auto choice = compiler.compile(
      {.kind = GrammarSpec::Kind::kChoice, .choices = {"LORD", "Moses", "light"}, .field = "c"});
  const auto json = compiler.compile(
      {.kind = GrammarSpec::Kind::kJsonSchema,
       .text = R"({"type":"object","properties":{"who":{"enum":["God","Adam","Eve"]},)"
               R"("day":{"type":"integer","minimum":1,"maximum":7}},"required":["who","day"]})",
       .field = "j"});
  const std::vector<std::string> prompts = {
      "And God said", "In the beginning God created the heaven and the earth.",
      "Let there be light", "And the evening and the morning were the third day."};
  std::vector<Case> cases;
  for (size_t i = 0; i < 12; ++i) {
    const std::shared_ptr<const CompiledGrammar> g[] = {regex, nullptr, choice, json};
    cases.push_back({.prompt = prompts[i % prompts.size()],
                     .grammar = g[i % 4],
                     .max_tokens = 24 + static_cast<int64_t>(i % 3) * 8,
                     .temperature = i % 3 == 1 ? 0.8f : 0.0f});
  }

  // Each request alone.
  std::vector<Drained> want;
  {
    Scheduler alone(*model, {.max_seqs = 1});
    for (size_t i = 0; i < cases.size(); ++i)
      want.push_back(drain(*alone.submit(request_of(*model, cases[i], 100 + i))));
  }
  const std::regex sentence("[A-Z][a-z]+( [a-z]+){2,6}\\.");
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(want[i].finish == FinishReason::kStop || want[i].finish == FinishReason::kLength)
        << "case " << i << ": " << want[i].error;
    if (cases[i].grammar == nullptr || want[i].finish != FinishReason::kStop) continue;
    const std::string text = text_of(*model, want[i].tokens);
    if (cases[i].grammar == regex) {
      EXPECT_TRUE(std::regex_match(text, sentence)) << "case " << i << ": " << text;
    } else if (cases[i].grammar == choice) {
      EXPECT_TRUE(text == "LORD" || text == "Moses" || text == "light") << text;
    } else {
      const nlohmann::json j = nlohmann::json::parse(text);
      EXPECT_TRUE(j.at("day").get<int>() >= 1 && j.at("day").get<int>() <= 7) << text;
    }
  }

  // All at once, three rounds (the mask workers' timing differs each time), every third
  // stream cancelled after its first event (its next mask is then queued or being filled).
  for (int round = 0; round < 3; ++round) {
    Scheduler sched(*model, {.max_seqs = 8, .prefill_chunk = 16});
    std::vector<std::shared_ptr<ServeStream>> streams;
    for (size_t i = 0; i < cases.size(); ++i)
      streams.push_back(sched.submit(request_of(*model, cases[i], 100 + i)));
    for (size_t i = 0; i < cases.size(); i += 3) {
      std::vector<ServeEvent> first;
      const auto give_up = std::chrono::steady_clock::now() + 30s;
      while (first.empty() && std::chrono::steady_clock::now() < give_up)
        streams[i]->next(first, 10ms);
      ASSERT_FALSE(first.empty()) << "case " << i << " never started";
      if (first.back().done) continue;  // it ended in its first event
      streams[i]->cancel();
      const Drained got = drain(*streams[i]);
      EXPECT_TRUE(got.finish == FinishReason::kCancelled || got.finish == want[i].finish)
          << "round " << round << " case " << i;
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      if (i % 3 == 0) continue;
      const Drained got = drain(*streams[i]);
      EXPECT_EQ(got.finish, want[i].finish) << "round " << round << " case " << i << got.error;
      EXPECT_EQ(got.tokens, want[i].tokens) << "round " << round << " case " << i;
    }
    const SchedulerStats st = settled(sched);
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.kv_pages_free + st.cache.pages_held, st.kv_pages_total);
  }
}

}  // namespace
}  // namespace metrale
