// The scheduler with the checkpoint's MTP layer as the drafter (engine/mtp_proposer.h): the
// scheduler records the target's final-norm hidden rows of each speculating stream's prefill
// chunks and verify rows, prefills each stream's drafter from its prompt's rows, and rolls the
// drafter back on rejection. Greedy streams decoding together equal each request run alone
// without drafts, on every family with MTP layers; a lone request drafts exactly what
// Session's MTP speculation drafts (so the drafter saw the same hidden rows); preemption by
// recompute rebuilds the drafter; every drafter page goes back with its stream.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>

#include "engine/mtp_proposer.h"
#include "engine/session.h"
#include "serve/scheduler.h"
#include "stream_drain.h"

namespace metrale {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Model> load(const std::string& fixture, int64_t kv_tokens = 1024) {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = kv_tokens;
  o.max_rows = 64;
  return Model::load("tests/data/fixtures/" + fixture, o);
}

using Outcome = serve_test::Drained;
using serve_test::drain;

using serve_test::settled;

// Token-id prompts (the fixtures have no tokenizer): repeats the drafter may learn from, and
// random ids, of different lengths so prefill chunks and verify rows mix in one step.
std::vector<ServeRequest> requests(int64_t max_tokens) {
  std::mt19937 rng(11);
  std::vector<ServeRequest> out;
  for (int i = 0; i < 4; ++i) {
    ServeRequest r;
    for (int j = 0; j < 5 + 3 * i; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % 300));
    r.prompt.insert(r.prompt.end(), {5, 9, 5, 9, 5, 9, 5, 11, 3});
    r.max_tokens = max_tokens + 5 * i;
    r.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

// Run before a scheduler takes the model (one thread uses a model at a time).
GenerateResult alone(Model& m, const ServeRequest& r, SpeculationOptions spec = {}) {
  GenerateOptions g;
  g.max_new_tokens = r.max_tokens;
  g.ignore_eos = r.ignore_eos;
  g.sampling = r.sampling;
  g.seed = r.seed;
  g.speculation = std::move(spec);
  Session s(m);
  return s.generate(r.prompt, g);
}

struct Mtp {
  std::shared_ptr<MtpProposer> drafter;
  SpeculationOptions options;
  explicit Mtp(Model& m, int64_t k = 3, int64_t streams = 3)
      : drafter(MtpProposer::load(m, {.kv_tokens = mtp_kv_tokens(m, streams, k)})) {
    options = {.proposer = drafter, .ladder = speculative::DraftLadder::constant(k)};
  }
};

class SchedulerMtp : public ::testing::TestWithParam<std::string> {};

TEST_P(SchedulerMtp, StreamsDecodingTogetherEqualEachRequestAloneWithoutDrafts) {
  auto model = load(GetParam());
  const std::vector<ServeRequest> reqs = requests(24);
  std::vector<GenerateResult> want;
  for (const ServeRequest& r : reqs) want.push_back(alone(*model, r));
  Mtp mtp(*model);
  {
    Scheduler sched(*model, {.max_seqs = 3, .prefill_chunk = 7, .speculation = mtp.options});
    std::vector<std::shared_ptr<ServeStream>> streams;
    for (const ServeRequest& r : reqs) streams.push_back(sched.submit(r));
    SpeculationCounts sum;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Outcome got = drain(*streams[i]);
      EXPECT_EQ(got.tokens, want[i].tokens) << GetParam() << " request " << i;
      EXPECT_TRUE(got.usage.speculative);
      EXPECT_GE(got.usage.draft_tokens, got.usage.accepted_draft_tokens);
      sum.drafted += got.usage.draft_tokens;
      sum.accepted += got.usage.accepted_draft_tokens;
    }
    EXPECT_GT(sum.drafted, 0) << GetParam();
    const SchedulerStats st = settled(sched);
    EXPECT_EQ(st.speculation.drafted, sum.drafted);
    EXPECT_EQ(st.speculation.accepted, sum.accepted);
    EXPECT_EQ(st.kv_pages_free + st.cache.pages_held, st.kv_pages_total);
    EXPECT_EQ(mtp.drafter->kv_pool().free_pages(), mtp.drafter->kv_pool().n_pages())
        << GetParam() << ": drafter pages leaked";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SchedulerMtp,
                         ::testing::Values("deepseek_v3_mtp_bf16", "glm4_moe_qknorm_bf16",
                                           "qwen3_next_bf16"));

// A lone request drafts and accepts exactly what Session's MTP speculation does: the drafter
// was prefilled from the same prompt hiddens and caught up with the same verify rows, though
// the scheduler's prefill ran in chunks of 5.
TEST(SchedulerMtpAlone, DraftsWhatSessionDrafts) {
  auto model = load("deepseek_v3_mtp_bf16");
  const ServeRequest r = requests(30)[2];
  Mtp mtp(*model);
  const GenerateResult want = alone(*model, r, mtp.options);
  ASSERT_GT(want.speculation.drafted, 0);
  Scheduler sched(*model, {.max_seqs = 1, .prefill_chunk = 5, .speculation = mtp.options});
  const Outcome got = drain(*sched.submit(r));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.usage.draft_tokens, want.speculation.drafted);
  EXPECT_EQ(got.usage.accepted_draft_tokens, want.speculation.accepted);
}

TEST(SchedulerMtpAlone, ARequestMayTurnItOff) {
  auto model = load("deepseek_v3_mtp_bf16");
  Mtp mtp(*model);
  serve_test::expect_a_request_may_turn_it_off(*model, mtp.options, requests(20)[0]);
}

// 8 pages of 16 tokens for 3 streams of ~60 tokens: the youngest stream is preempted and
// recomputed, its drafter freed and prefilled again from the recomputed rows; every output is
// unchanged and every drafter page back.
TEST(SchedulerMtpAlone, PreemptionRebuildsTheDrafter) {
  auto model = load("deepseek_v3_mtp_bf16", /*kv_tokens=*/128);
  std::vector<ServeRequest> reqs = requests(40);
  reqs.resize(3);
  std::vector<GenerateResult> want;
  for (ServeRequest& r : reqs) {
    r.max_tokens = 40;
    want.push_back(alone(*model, r));
  }
  Mtp mtp(*model);
  Scheduler sched(*model, {.max_seqs = 3, .speculation = mtp.options});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (const ServeRequest& r : reqs) streams.push_back(sched.submit(r));
  int64_t drafted = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Outcome got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got.finish, FinishReason::kLength);
    drafted += got.usage.draft_tokens;
  }
  EXPECT_GT(drafted, 0);
  EXPECT_GT(settled(sched).preemptions, 0);
  EXPECT_EQ(mtp.drafter->kv_pool().free_pages(), mtp.drafter->kv_pool().n_pages());
}

// MTP carry (SchedulerOptions::carry_tokens): a session's next request adopts the drafter
// rows its last request left and prefills its drafter only over the new span. Every row the
// drafter then computes (its logits, by key) equals, bit for bit, the row a fresh drafter
// prefill of the whole prompt gives — so the adopted KV rows are the fresh prefill's — and the
// output is the plain decode's.
struct Traced {
  std::shared_ptr<MtpProposer> drafter;
  SpeculationOptions options;
  std::map<int64_t, std::vector<float>> logits;  // by key: the last row computed
  Traced(Model& m, int64_t carry_tokens)
      : drafter(MtpProposer::load(m, {.kv_tokens = mtp_kv_tokens(m, 3, 3) + carry_tokens})) {
    options = {.proposer = drafter, .ladder = speculative::DraftLadder::constant(3)};
    const int64_t V = m.vocab_size();
    drafter->set_trace([this, V](const speculative::ProposerState&, int64_t key, const float* l,
                                 const float*) { logits[key].assign(l, l + V); });
  }
};

ServeRequest turn(std::vector<int32_t> prompt, std::string session, int64_t max_tokens = 16) {
  ServeRequest r;
  r.prompt = std::move(prompt);
  r.session = std::move(session);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

int64_t outcome(const SchedulerStats& st, speculative::CarryOutcome o) {
  return st.carry_outcomes[static_cast<size_t>(o)];
}

TEST(SchedulerMtpCarry, TheNextTurnAdoptsRowsEqualToAFreshPrefill) {
  auto model = load("deepseek_v3_mtp_bf16");
  const ServeRequest first = turn(requests(16)[1].prompt, "chat");
  // Turn 1 and the second turn's prompt: the first prompt, its reply, a new user span.
  std::vector<int32_t> second_prompt;
  {
    Scheduler sched(*model, {.max_seqs = 3, .speculation = Mtp(*model).options});
    second_prompt = first.prompt;
    const Outcome reply = drain(*sched.submit(first));
    second_prompt.insert(second_prompt.end(), reply.tokens.begin(), reply.tokens.end());
    second_prompt.insert(second_prompt.end(), {7, 8, 9, 10, 12, 5, 9});
  }
  const ServeRequest second = turn(second_prompt, "chat", 20);
  const GenerateResult want = alone(*model, second);

  // Fresh: the second turn alone, its drafter prefilled over the whole prompt.
  Traced fresh(*model, 0);
  Outcome fresh_out;
  {
    Scheduler sched(*model, {.max_seqs = 3, .speculation = fresh.options});
    fresh_out = drain(*sched.submit(second));
    EXPECT_EQ(outcome(settled(sched), speculative::CarryOutcome::kAdopted), 0);
  }
  // Carried: turn 1, then turn 2 adopts its rows.
  Traced carried(*model, 1024);
  Scheduler sched(*model, {.max_seqs = 3, .speculation = carried.options, .carry_tokens = 1024});
  drain(*sched.submit(first));
  const SchedulerStats after_first = settled(sched);
  EXPECT_EQ(outcome(after_first, speculative::CarryOutcome::kNoCarry), 1);
  EXPECT_GT(after_first.carry_rows_held, 0);
  const int64_t prefill_rows_first = after_first.drafter_prefill_rows;
  EXPECT_EQ(prefill_rows_first, static_cast<int64_t>(first.prompt.size()) - 1);
  carried.logits.clear();
  const Outcome got = drain(*sched.submit(second));
  const SchedulerStats st = settled(sched);

  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(fresh_out.tokens, want.tokens);
  EXPECT_EQ(outcome(st, speculative::CarryOutcome::kAdopted), 1);
  // Turn 1's context but its last token (key k needs t_{k+1}) and the reply's last row
  // (computed only once its successor is known): at least the first prompt's keys.
  const int64_t adopted = st.carry_rows_adopted;
  EXPECT_GE(adopted, static_cast<int64_t>(first.prompt.size()) - 1);
  const int64_t appended = st.drafter_prefill_rows - prefill_rows_first;
  EXPECT_EQ(adopted + appended, static_cast<int64_t>(second.prompt.size()) - 1)
      << "adopted " << adopted << " + appended " << appended;
  EXPECT_LT(appended, static_cast<int64_t>(second.prompt.size()) - 1);
  // The same drafts, and every drafter row computed after the adoption equal to the fresh one.
  EXPECT_EQ(got.usage.draft_tokens, fresh_out.usage.draft_tokens);
  EXPECT_EQ(got.usage.accepted_draft_tokens, fresh_out.usage.accepted_draft_tokens);
  ASSERT_FALSE(carried.logits.empty());
  for (const auto& [key, row] : carried.logits) {
    if (key < adopted) continue;  // turn 1's rows computed late (pending at its end)
    ASSERT_TRUE(fresh.logits.count(key)) << "key " << key;
    EXPECT_EQ(row, fresh.logits[key]) << "key " << key;
  }
}

// Each outcome is counted once per request: no session or nothing carried (kNoCarry), adopted,
// another session's conversation (kForeignSession), the same session with another prefix
// (kPrefixMismatch), and a session whose last request left no drafter rows (kNoHiddens: it
// ended on its first token, before its drafter began). (kForeignHiddens needs a LoRA adapter:
// speculative/mtp_carry's tests.) The budget bounds the rows held, and every drafter page is
// back once the scheduler stops.
TEST(SchedulerMtpCarry, EachOutcomeIsCounted) {
  using speculative::CarryOutcome;
  auto model = load("deepseek_v3_mtp_bf16");
  Traced mtp(*model, 1024);
  {
    Scheduler sched(*model, {.max_seqs = 3, .speculation = mtp.options, .carry_tokens = 1024});
    const std::vector<int32_t> p = requests(8)[2].prompt;
    const Outcome a1 = drain(*sched.submit(turn(p, "a")));  // no record: kNoCarry
    std::vector<int32_t> next = p;
    next.insert(next.end(), a1.tokens.begin(), a1.tokens.end());
    next.push_back(42);
    drain(*sched.submit(turn(next, "a")));                  // kAdopted
    drain(*sched.submit(turn(next, "b")));                  // a's conversation: kForeignSession
    drain(*sched.submit(turn({100, 101, 102, 103}, "a")));  // kPrefixMismatch
    drain(*sched.submit(turn({60, 61, 62}, "c", 1)));       // kNoCarry; no drafter rows
    drain(*sched.submit(turn({60, 61, 62, 63}, "c")));      // kNoHiddens
    drain(*sched.submit(turn(next, "")));                   // no session: kNoCarry
    const SchedulerStats st = settled(sched);
    EXPECT_EQ(outcome(st, CarryOutcome::kNoCarry), 3);
    EXPECT_EQ(outcome(st, CarryOutcome::kAdopted), 1);
    EXPECT_EQ(outcome(st, CarryOutcome::kForeignSession), 1);
    EXPECT_EQ(outcome(st, CarryOutcome::kPrefixMismatch), 1);
    EXPECT_EQ(outcome(st, CarryOutcome::kNoHiddens), 1);
    EXPECT_EQ(outcome(st, CarryOutcome::kForeignHiddens), 0);
    EXPECT_GT(st.carry_rows_held, 0);
    EXPECT_LE(st.carry_rows_held, 1024);
  }
  EXPECT_EQ(mtp.drafter->kv_pool().free_pages(), mtp.drafter->kv_pool().n_pages());
}

// Drafter prefill off (SpeculationOptions::drafter_prefill): each stream's drafter starts at its
// prompt's last key, so the scheduler asks no prompt logits but the last row's, a speculating
// stream attaches the cached prefix of an earlier request, and a session's record holds no
// drafter rows (its next request reads kNoHiddens). The output is still each request's alone.
TEST(SchedulerMtpNoPrefill, OutputUnchangedAndCachedPrefixesAttached) {
  using speculative::CarryOutcome;
  auto model = load("deepseek_v3_mtp_bf16");
  const std::vector<ServeRequest> reqs = requests(24);
  std::vector<GenerateResult> want;
  for (const ServeRequest& r : reqs) want.push_back(alone(*model, r));
  Mtp mtp(*model);
  mtp.options.drafter_prefill = false;
  {
    Scheduler sched(
        *model,
        {.max_seqs = 3, .prefill_chunk = 7, .speculation = mtp.options, .carry_tokens = 1024});
    std::vector<std::shared_ptr<ServeStream>> streams;
    for (const ServeRequest& r : reqs) streams.push_back(sched.submit(r));
    int64_t drafted = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Outcome got = drain(*streams[i]);
      EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
      drafted += got.usage.draft_tokens;
    }
    EXPECT_GT(drafted, 0);
    EXPECT_EQ(settled(sched).drafter_prefill_rows, 0);
    // The same prompt again: its cached pages are attached, and it still drafts.
    const Outcome again = drain(*sched.submit(reqs[3]));
    EXPECT_EQ(again.tokens, want[3].tokens);
    EXPECT_GT(again.usage.cached_tokens, 0);
    EXPECT_GT(again.usage.draft_tokens, 0);
    // A session's turns: nothing carried, and the record says why.
    ServeRequest t1 = turn(reqs[1].prompt, "s");
    const Outcome r1 = drain(*sched.submit(t1));
    t1.prompt.insert(t1.prompt.end(), r1.tokens.begin(), r1.tokens.end());
    t1.prompt.push_back(42);
    drain(*sched.submit(t1));
    const SchedulerStats st = settled(sched);
    EXPECT_EQ(outcome(st, CarryOutcome::kNoHiddens), 1);
    EXPECT_EQ(outcome(st, CarryOutcome::kAdopted), 0);
    EXPECT_EQ(st.carry_rows_adopted, 0);
    EXPECT_EQ(st.carry_rows_held, 0);
  }
  EXPECT_EQ(mtp.drafter->kv_pool().free_pages(), mtp.drafter->kv_pool().n_pages());
}

}  // namespace
}  // namespace metrale
