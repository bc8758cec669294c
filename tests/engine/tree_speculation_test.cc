// Tree drafting through the engine (engine/speculation.h, SpeculationOptions::tree): a draft
// tree is verified in one step with tree attention, the walk follows the child whose draft is
// the target's pick, the accepted path is compacted into place, and the drafter hears the path —
// with greedy output unchanged token for token on every family (dense, MoE, MLA, hybrid Gated
// DeltaNet; weight formats), seeded sampling unchanged too, n-gram and MTP drafters alike, no
// page leaked.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/mtp_proposer.h"
#include "engine/session.h"
#include "fixture_util.h"
#include "speculative/ngram_proposer.h"

namespace metrale {
namespace {

using speculative::DraftTree;

std::unique_ptr<Model> load(const std::string& fixture) {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 512;
  o.page_size = 8;
  // Hybrid models keep every tree row's state: a ring deep enough for the largest tree here.
  if (fixture.starts_with("qwen3_next") || fixture.starts_with("qwen3_5")) o.state_ring_depth = 14;
  return Model::load(testing::fixture_dir(fixture), o);
}

GenerateOptions greedy(int64_t n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.ignore_eos = true;
  return o;
}

GenerateResult run(Model& m, const std::vector<int32_t>& prompt, const GenerateOptions& o) {
  Session s(m);
  return s.generate(prompt, o);
}

// A full binary tree three drafts deep: node 2k + 2 and 2k + 3 below node k.
DraftTree binary3() { return DraftTree::parse("-1,-1,0,0,1,1,2,2,3,3,4,4,5,5"); }

// Knows the answer (`truth`: prompt and plain output) and hides it in the tree: at depth d the
// right token is child `rank(step, d)` of the right parent (the step's plan: the bits of
// step % 8), every other node wrong. So each verify accepts a path that leaves the main chain
// at a planned depth (or never), and the drafter must be told that path.
class PlantedTreeProposer final : public speculative::DraftProposer {
 public:
  PlantedTreeProposer(std::vector<int32_t> truth, int32_t vocab)
      : truth_(std::move(truth)), vocab_(vocab) {}
  std::string_view name() const override { return "planted"; }
  bool needs_hidden() const override { return false; }

  int64_t planned_accepts = 0;     // drafts the plans made acceptable, summed
  int64_t off_chain_catchups = 0;  // catchups of a path that left the main chain

 protected:
  std::unique_ptr<speculative::ProposerState> do_alloc_state() override {
    return std::make_unique<speculative::ProposerState>();
  }
  void do_prefill(speculative::ProposerState&, std::span<const int32_t>, ConstRows) override {}
  void do_propose(const speculative::ProposeArgs&, std::vector<int32_t>&) override {
    ADD_FAILURE() << "a tree run asked for a chain";
  }
  void do_propose_tree_batch(std::span<const speculative::ProposeArgs> args, const DraftTree& shape,
                             std::span<speculative::TreeDrafts> out) override {
    for (size_t i = 0; i < args.size(); ++i) {
      const speculative::ProposeArgs& a = args[i];
      EXPECT_EQ(a.last, truth_.at(static_cast<size_t>(a.position)));
      const int64_t step = step_++;
      const int64_t room = static_cast<int64_t>(truth_.size()) - a.position - 1;
      const int64_t depth = std::min(a.n, room);
      // Handle: depth + 1 for a node on the right path (0: the root), -1 off it.
      speculative::fill_tree(
          shape, depth, 0,
          [&](int64_t h, int64_t rank) {
            const int64_t d = h < 0 ? -1 : h;  // the parent's depth on the right path
            const int32_t right = d < 0 ? 0 : truth_[static_cast<size_t>(a.position + 1 + d)];
            const bool planted = d >= 0 && rank == ((step >> d) & 1);
            // Wrong tokens: distinct from the right one and from each other.
            const auto wrong = static_cast<int32_t>((right + 1 + rank) % vocab_);
            return speculative::TreeGuess{.token = planted ? right : wrong,
                                          .handle = planted ? d + 1 : -1};
          },
          out[i]);
      int64_t planned = 0;
      for (int64_t d = 0; d < depth && d < shape.max_depth(); ++d) ++planned;
      planned_ = planned;
      // The main chain begins with the right tokens up to the first planted rank 1.
      main_right_ = 0;
      while (main_right_ < planned && ((step >> main_right_) & 1) == 0) ++main_right_;
    }
  }
  void do_after_verify(speculative::ProposerState&, int64_t drafted, int64_t accepted) override {
    if (drafted == 0) return;
    EXPECT_LE(accepted, main_right_);
    planned_accepts += planned_;
  }
  void do_catchup(speculative::ProposerState&, const speculative::CatchupRows& rows) override {
    ++off_chain_catchups;
    for (size_t r = 0; r < rows.ids.size(); ++r) {
      EXPECT_EQ(rows.ids[r], truth_.at(static_cast<size_t>(rows.first_key + 1) + r))
          << "the drafter was told a path that is not the output";
    }
  }

 private:
  std::vector<int32_t> truth_;
  int32_t vocab_;
  int64_t step_ = 0, planned_ = 0, main_right_ = 0;
};

class TreeDrafts : public ::testing::TestWithParam<std::string> {};

TEST_P(TreeDrafts, PlantedPathsAreAcceptedOffTheMainChainAndChangeNoToken) {
  auto m = load(GetParam());
  const std::vector<int32_t> prompt = testing::Reference(GetParam()).ids("input_ids");
  constexpr int64_t kTokens = 40;
  const GenerateResult plain = run(*m, prompt, greedy(kTokens));
  std::vector<int32_t> truth = prompt;
  truth.insert(truth.end(), plain.tokens.begin(), plain.tokens.end());
  auto proposer =
      std::make_shared<PlantedTreeProposer>(truth, static_cast<int32_t>(m->vocab_size()));
  GenerateOptions o = greedy(kTokens);
  o.speculation = {
      .proposer = proposer, .ladder = speculative::DraftLadder::constant(3), .tree = binary3()};
  const GenerateResult spec = run(*m, prompt, o);
  EXPECT_EQ(spec.tokens, plain.tokens);
  // Every planted path is accepted whole: three drafts a step, where the output has room.
  EXPECT_EQ(spec.speculation.accepted, proposer->planned_accepts);
  EXPECT_GE(spec.speculation.accepted, 3 * (spec.speculation.verify_steps - 2));
  EXPECT_GT(proposer->off_chain_catchups, 0) << "no path left the main chain";
  // The whole tree is verified: far more rows than the accepted path.
  EXPECT_GT(spec.speculation.drafted, 3 * spec.speculation.accepted);
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages()) << "pages leaked";
}

TEST_P(TreeDrafts, NgramTreesChangeNoTokenGreedyOrSeeded) {
  auto m = load(GetParam());
  // A context where the suffix "7" was followed by several tokens: the n-gram trie branches.
  const std::vector<int32_t> prompt = {7, 7, 5, 7, 9, 7, 7, 5, 7, 9, 7, 11, 7, 7};
  constexpr int64_t kTokens = 48;
  for (const bool sampled : {false, true}) {
    GenerateOptions o = greedy(kTokens);
    if (sampled) {
      o.sampling.temperature = 0.8f;
      o.seed = 1234;
    }
    const GenerateResult plain = run(*m, prompt, o);
    o.speculation = {.proposer = std::make_shared<speculative::NgramProposer>(),
                     .ladder = speculative::DraftLadder::constant(4),
                     .tree = DraftTree::parse("-1,-1,-1,0,0,1,3,3,6")};
    const GenerateResult spec = run(*m, prompt, o);
    EXPECT_EQ(spec.tokens, plain.tokens) << (sampled ? "seeded sampling" : "greedy");
    EXPECT_GT(spec.speculation.drafted, 0);
    EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages()) << "pages leaked";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TreeDrafts,
                         ::testing::Values("llama_f32", "qwen3_bf16", "qwen3_moe_bf16",
                                           "deepseek_v3_bias_bf16", "glm4_moe_plain_bf16",
                                           "quant_ct_w4a16", "qwen3_next_f32", "qwen3_5_text_bf16",
                                           "qwen3_5_moe_text_f32"));

// The checkpoint's MTP layer drafting trees: the main chain as it drafts chains, its runner-up
// tokens beside; greedy output unchanged, and the drafter's pages back.
TEST(TreeDraftsMtp, MtpTreesChangeNoToken) {
  for (const std::string fixture :
       {"deepseek_v3_mtp_bf16", "glm4_moe_qknorm_bf16", "qwen3_next_bf16"}) {
    auto m = load(fixture);
    const std::vector<int32_t> prompt = {5, 9, 5, 9, 5, 9, 5, 11, 3};
    constexpr int64_t kTokens = 40;
    const GenerateResult plain = run(*m, prompt, greedy(kTokens));
    // Branches at the root and below it; a chain written as parents; one root child whose
    // child branches.
    for (const char* shape : {"-1,-1,-1,0,0,3,3", "-1,0,1", "-1,0,0,1"}) {
      GenerateOptions o = greedy(kTokens);
      auto drafter = MtpProposer::load(*m);
      const MtpProposer* d = drafter.get();
      o.speculation = {.proposer = std::move(drafter),
                       .ladder = speculative::DraftLadder::constant(3),
                       .tree = DraftTree::parse(shape)};
      const GenerateResult spec = run(*m, prompt, o);
      EXPECT_EQ(spec.tokens, plain.tokens) << fixture << " " << shape;
      EXPECT_GT(spec.speculation.drafted, 0) << fixture << " " << shape;
      EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().n_pages()) << fixture << " " << shape;
      EXPECT_EQ(d->kv_pool().free_pages(), d->kv_pool().n_pages()) << fixture << " " << shape;
    }
  }
}

}  // namespace
}  // namespace metrale
