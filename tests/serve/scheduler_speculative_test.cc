// The scheduler with speculative decoding (SchedulerOptions::speculation): every stream still
// equals the same request run alone without drafts (Session::generate) — greedy and seeded
// sampling, in company, with chunked prefill beside verify rows, through preemption, on a
// hybrid model — and each request's drafts and accepted drafts reach its usage and the
// scheduler's figures; a request may turn speculation off.
#include <gtest/gtest.h>

#include <thread>

#include "engine/session.h"
#include "serve/scheduler.h"
#include "speculative/ngram_proposer.h"
#include "stream_drain.h"

namespace metrale {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Model> load(const std::string& dir, int64_t kv_tokens = 1024) {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = kv_tokens;
  o.max_rows = 64;
  return Model::load(dir, o);
}

SpeculationOptions ngram(int64_t k = 4) {
  return {.proposer = std::make_shared<speculative::NgramProposer>(),
          .ladder = speculative::DraftLadder::constant(k)};
}

using Outcome = serve_test::Drained;
using serve_test::drain;
using serve_test::settled;

const std::vector<std::string> kPrompts = {
    "And God said, I am the LORD. And God said, I am the LORD. And God said",
    "In the beginning God created the heaven and the earth. And the earth was without form",
    "And the evening and the morning were the third day. And the evening and the morning",
    "the",
    "And God said, Let there be light: and there was light. And God saw the light",
};

// Run before a scheduler takes the model (one thread uses a model at a time).
GenerateResult alone(Model& m, const ServeRequest& r) {
  GenerateOptions g;
  g.max_new_tokens = r.max_tokens;
  g.ignore_eos = r.ignore_eos;
  g.sampling = r.sampling;
  g.seed = r.seed;
  Session s(m);
  return s.generate(r.prompt, g);
}

std::vector<ServeRequest> requests(const Model& m, int64_t max_tokens) {
  std::vector<ServeRequest> out;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ServeRequest r;
    r.prompt = m.tokenizer()->encode(kPrompts[i], /*add_special_tokens=*/false);
    r.max_tokens = max_tokens + 7 * static_cast<int64_t>(i);
    r.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

TEST(SchedulerSpeculative, StreamsEqualEachRequestRunAloneWithoutDrafts) {
  auto model = load("models/demo");
  const std::vector<ServeRequest> reqs = requests(*model, 40);
  std::vector<GenerateResult> want;
  for (const ServeRequest& r : reqs) want.push_back(alone(*model, r));
  Scheduler sched(*model, {.max_seqs = 3, .prefill_chunk = 9, .speculation = ngram()});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (const ServeRequest& r : reqs) streams.push_back(sched.submit(r));
  SpeculationCounts sum;
  int64_t drafting = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Outcome got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got.text, want[i].text) << "request " << i;
    EXPECT_TRUE(got.usage.speculative);
    EXPECT_GE(got.usage.draft_tokens, got.usage.accepted_draft_tokens);
    sum.drafted += got.usage.draft_tokens;
    sum.accepted += got.usage.accepted_draft_tokens;
    drafting += got.usage.draft_tokens > 0 ? 1 : 0;
  }
  EXPECT_GT(sum.accepted, 0);
  const SchedulerStats st = settled(sched);
  EXPECT_EQ(st.speculation.drafted, sum.drafted);
  EXPECT_EQ(st.speculation.accepted, sum.accepted);
  EXPECT_GT(st.speculation.verify_steps, 0);
  EXPECT_EQ(st.acceptance_count, drafting);
  EXPECT_EQ(st.acceptance_le[std::size(SchedulerStats::kAcceptanceBuckets) - 1], drafting);
  EXPECT_EQ(st.kv_pages_free + st.cache.pages_held, st.kv_pages_total);
}

TEST(SchedulerSpeculative, ARequestMayTurnItOff) {
  auto model = load("models/demo");
  serve_test::expect_a_request_may_turn_it_off(*model, ngram(), requests(*model, 30)[0]);
}

TEST(SchedulerSpeculative, SeededSamplingEqualsPlainSampling) {
  auto model = load("models/demo");
  std::vector<ServeRequest> reqs = requests(*model, 30);
  std::vector<GenerateResult> want;
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f};
    reqs[i].seed = 100 + i;
    want.push_back(alone(*model, reqs[i]));
  }
  Scheduler sched(*model, {.max_seqs = 4, .prefill_chunk = 6, .speculation = ngram(3)});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (const ServeRequest& r : reqs) streams.push_back(sched.submit(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(drain(*streams[i]).tokens, want[i].tokens) << "request " << i;
  }
}

// 8 pages of 16 tokens for 3 streams of ~60 tokens and their drafts: drafts give way first,
// then the youngest stream is preempted and recomputed, its drafter begun again; every output
// is unchanged.
TEST(SchedulerSpeculative, PreemptionKeepsEveryStreamUnchanged) {
  auto model = load("models/demo", /*kv_tokens=*/128);
  std::vector<ServeRequest> reqs = requests(*model, 40);
  reqs.resize(3);
  std::vector<GenerateResult> want;
  for (ServeRequest& r : reqs) {
    r.max_tokens = 40;
    want.push_back(alone(*model, r));
  }
  Scheduler sched(*model, {.max_seqs = 3, .speculation = ngram()});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (const ServeRequest& r : reqs) streams.push_back(sched.submit(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Outcome got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got.finish, FinishReason::kLength);
  }
  EXPECT_GT(sched.stats().preemptions, 0);
}

// Draft trees (SpeculationOptions::tree) in company: greedy and seeded streams beside prefill
// chunks, and a KV pool small enough to preempt; every output equals its request run alone.
TEST(SchedulerSpeculative, DraftTreesKeepEveryStreamUnchanged) {
  SpeculationOptions tree = ngram(3);
  tree.tree = speculative::DraftTree::parse("-1,-1,0,0,1,2,4");
  for (const int64_t kv_tokens : {1024, 128}) {
    auto model = load("models/demo", kv_tokens);
    std::vector<ServeRequest> reqs = requests(*model, 36);
    if (kv_tokens < 1024) reqs.resize(3);
    std::vector<GenerateResult> want;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (i % 2 == 1) {
        reqs[i].sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f};
        reqs[i].seed = 300 + i;
      }
      want.push_back(alone(*model, reqs[i]));
    }
    Scheduler sched(*model, {.max_seqs = 3, .prefill_chunk = 7, .speculation = tree});
    std::vector<std::shared_ptr<ServeStream>> streams;
    for (const ServeRequest& r : reqs) streams.push_back(sched.submit(r));
    int64_t accepted = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Outcome got = drain(*streams[i]);
      EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i << ", kv " << kv_tokens;
      accepted += got.usage.accepted_draft_tokens;
    }
    EXPECT_GT(accepted, 0) << "kv " << kv_tokens;
    if (kv_tokens < 1024) {
      EXPECT_GT(sched.stats().preemptions, 0);
    }
    const SchedulerStats st = settled(sched);
    EXPECT_EQ(st.kv_pages_free + st.cache.pages_held, st.kv_pages_total);
  }
}

// A hybrid model: rejected drafts roll the recurrent state back through the ring.
TEST(SchedulerSpeculative, AHybridModelRollsItsStateBack) {
  auto model = load("tests/data/fixtures/qwen3_next_f32", 512);
  std::vector<ServeRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    ServeRequest r;
    r.prompt = std::vector<int32_t>(static_cast<size_t>(6 + i), 7 + i);
    r.prompt.insert(r.prompt.end(), {3, 4, 5, 3, 4, 5});
    r.max_tokens = 24;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  std::vector<GenerateResult> want;
  for (const ServeRequest& r : reqs) want.push_back(alone(*model, r));
  Scheduler sched(
      *model,
      {.max_seqs = 3, .prefill_chunk = 5, .cache = {.enabled = false}, .speculation = ngram()});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (const ServeRequest& r : reqs) streams.push_back(sched.submit(r));
  int64_t drafted = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Outcome got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
    drafted += got.usage.draft_tokens;
  }
  EXPECT_GT(drafted, 0);
}

TEST(SchedulerSpeculative, BadOptionsAreRefused) {
  auto model = load("models/demo");
  SpeculationOptions bad = ngram(8);
  bad.dispatch_cap = 4;
  EXPECT_THROW(Scheduler(*model, {.speculation = bad}), Error);
}

}  // namespace
}  // namespace metrale
