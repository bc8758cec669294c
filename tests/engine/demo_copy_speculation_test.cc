// n-gram (prompt-lookup) drafting on an input-grounded task, with the model that ships for it:
// models/demo_copy (tools/demo/train_demo_copy.py: models/demo fine-tuned to copy what its
// context holds). The prompt is a passage it never trained on, then its first words again; the
// greedy answer copies the passage, so the drafts the n-gram proposer copies from the prompt are
// accepted. Output is plain decoding's token for token, alone and in a batch. Acceptance is held
// to floors well below what this build measures (stated), since a near-tie may resolve otherwise
// on another CPU's kernels.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/session.h"
#include "speculative/ngram_proposer.h"

namespace metrale {
namespace {

constexpr int64_t kTokens = 64;

// The edit prompt: the first case of the transformers reference (tests/data/demo_copy).
std::string edit_prompt() {
  std::ifstream in("tests/data/demo_copy/reference.json");
  EXPECT_TRUE(in) << "tests/data/demo_copy/reference.json";
  return nlohmann::json::parse(in).at("cases").at(0).at("prompt").get<std::string>();
}

TEST(DemoCopy, NgramDraftsCopiedFromThePromptAreAcceptedAndChangeNoToken) {
  LoadOptions lo;
  lo.n_threads = 2;
  lo.kv_tokens = 1024;
  auto m = Model::load("models/demo_copy", lo);
  const Tokenizer& tok = *m->tokenizer();
  const std::string text = edit_prompt();
  const std::vector<int32_t> prompt = tok.encode(text, true);
  // The passage's own tokens after the cue: what a perfect copy would generate.
  const size_t cut = text.rfind('\n');
  ASSERT_NE(cut, std::string::npos);
  const std::vector<int32_t> passage = tok.encode(text.substr(0, cut), true);
  const std::vector<int32_t> cue = tok.encode(text.substr(cut + 1), false);

  GenerateOptions plain_options;
  plain_options.max_new_tokens = kTokens;
  plain_options.ignore_eos = true;
  const std::vector<int32_t> plain = Session(*m).generate(prompt, plain_options).tokens;
  ASSERT_EQ(plain.size(), static_cast<size_t>(kTokens));
  // The model copies: the greedy tokens follow the passage (measured: see the printout).
  size_t copied = 0;
  while (copied < plain.size() && cue.size() + copied < passage.size() &&
         plain[copied] == passage[cue.size() + copied]) {
    ++copied;
  }

  // Floors on accepted drafts per verify step. Measured (x86-64, this build): K = 2 1.36 (34 of
  // 49 drafts), K = 4 2.47 (42 of 65), K = 8 3.21 (45 of 99); the first 29 tokens copy.
  const std::map<int64_t, double> floors = {{2, 1.0}, {4, 1.6}, {8, 2.0}};
  for (const auto& [k, floor] : floors) {
    GenerateOptions o = plain_options;
    o.speculation = {.proposer = std::make_shared<speculative::NgramProposer>(),
                     .ladder = speculative::DraftLadder::constant(k)};
    Session s(*m);
    const GenerateResult r = s.generate(prompt, o);
    EXPECT_EQ(r.tokens, plain) << "K = " << k;
    const SpeculationCounts& c = r.speculation;
    const double share =
        static_cast<double>(c.accepted) / static_cast<double>(std::max<int64_t>(c.drafted, 1));
    const double per_step =
        static_cast<double>(c.accepted) / static_cast<double>(std::max<int64_t>(c.verify_steps, 1));
    std::printf(
        "K = %lld: first %zu tokens copy the passage; %lld verify steps, %lld drafted, "
        "%lld accepted (%.3f, %.2f per step)\n",
        static_cast<long long>(k), copied, static_cast<long long>(c.verify_steps),
        static_cast<long long>(c.drafted), static_cast<long long>(c.accepted), share, per_step);
    EXPECT_GE(per_step, floor) << "K = " << k;

    // Two streams of the same prompt in one batch: the same tokens and drafts.
    const std::vector<GenerateResult> batch = generate_batch(*m, {prompt, prompt}, o);
    for (const GenerateResult& b : batch) {
      EXPECT_EQ(b.tokens, plain) << "batch, K = " << k;
      EXPECT_EQ(b.speculation.accepted, c.accepted) << "batch, K = " << k;
    }
  }
  EXPECT_GE(copied, 24u) << "the model no longer copies its prompt";
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages()) << "pages leaked";
}

}  // namespace
}  // namespace metrale
