// Embedding requests in the scheduler: pooled in the same steps as generation streams, each
// embedding equals engine/embedding.h's embed() of that input alone (bit for bit) and each
// stream equals its request run alone, whether inputs are chunked, wait for KV pages or adopt
// a cached prefix (last-token pooling only) or run beside speculative decode rows (they never
// get drafts); a group of inputs is queued whole or refused.
#include <gtest/gtest.h>

#include <thread>

#include "engine/session.h"
#include "serve/scheduler.h"
#include "speculative/ngram_proposer.h"
#include "stream_drain.h"

namespace metrale {
namespace {

using namespace std::chrono_literals;

std::string dir_of(const std::string& name) { return "tests/data/fixtures/embedding/" + name; }

std::unique_ptr<Model> load(const std::string& name, int64_t kv_tokens = 512) {
  return Model::load(dir_of(name), {.n_threads = 2, .kv_tokens = kv_tokens, .max_rows = 32});
}

using Done = serve_test::Drained;
using serve_test::drain;

const std::vector<std::string> kTexts = {
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "Instruct: Given a web search query, retrieve relevant passages\nQuery: what is a vector?",
    "Hello, world!",
    "  spaces\tand\nnewlines  ",
};

ServeRequest embedding_request(const Model& m, const std::string& text, int64_t dims = 0) {
  ServeRequest r;
  r.prompt = m.tokenizer()->encode(text, true);
  r.embedding = EmbeddingParams{.dimensions = dims};
  return r;
}

std::vector<float> alone(Model& m, const EmbeddingConfig& c, const std::string& text,
                         int64_t dims = 0) {
  const std::vector<std::vector<int32_t>> one = {m.tokenizer()->encode(text, true)};
  return embed(m, c, one, dims).front();
}

class EmbeddingScheduler : public ::testing::TestWithParam<const char*> {};

TEST_P(EmbeddingScheduler, EmbeddingsBesideGenerationEqualEachRunAlone) {
  auto m = load(GetParam());
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  std::vector<std::vector<float>> want, want_cut;
  for (const std::string& t : kTexts) {
    want.push_back(alone(*m, c, t));
    want_cut.push_back(alone(*m, c, t, 8));
  }
  const std::vector<int32_t> prompt = m->tokenizer()->encode("And God said", false);
  GenerateOptions g;
  g.max_new_tokens = 12;
  g.ignore_eos = true;
  const GenerateResult gen = Session(*m).generate(prompt, g);

  // Small prefill chunks: the long inputs run over several steps beside the decode rows.
  Scheduler sched(*m, {.max_seqs = 2, .prefill_chunk = 7, .embedding = c, .max_embedding_seqs = 3});
  std::vector<std::shared_ptr<ServeStream>> gens;
  for (int i = 0; i < 2; ++i) {
    ServeRequest r;
    r.prompt = prompt;
    r.max_tokens = 12;
    r.ignore_eos = true;
    gens.push_back(sched.submit(std::move(r)));
  }
  std::vector<ServeRequest> rs;
  for (const std::string& t : kTexts) rs.push_back(embedding_request(*m, t));
  for (const std::string& t : kTexts) rs.push_back(embedding_request(*m, t, 8));
  const std::vector<std::shared_ptr<ServeStream>> embs = sched.submit_all(std::move(rs));
  for (size_t i = 0; i < embs.size(); ++i) {
    const Done d = drain(*embs[i]);
    EXPECT_EQ(d.finish, FinishReason::kStop) << d.error;
    EXPECT_TRUE(d.tokens.empty());
    const size_t t = i % kTexts.size();
    EXPECT_EQ(d.embedding, i < kTexts.size() ? want[t] : want_cut[t]) << i;
    EXPECT_EQ(d.usage.prompt_tokens,
              static_cast<int64_t>(m->tokenizer()->encode(kTexts[t], true).size()));
    EXPECT_EQ(d.usage.completion_tokens, 0);
  }
  for (auto& s : gens) {
    const Done d = drain(*s);
    EXPECT_EQ(d.finish, FinishReason::kLength) << d.error;
    EXPECT_EQ(d.tokens, gen.tokens);
  }
}

TEST_P(EmbeddingScheduler, InputsThatOverflowTheKvCacheTakeTurns) {
  // 6 pages of 16 tokens: the 89-token input alone fills them, so inputs wait for each other.
  auto m = load(GetParam(), 96);
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  std::vector<std::vector<float>> want;  // before the scheduler's thread owns the model
  for (const std::string& t : kTexts) want.push_back(alone(*m, c, t));
  Scheduler sched(*m, {.prefill_chunk = 16, .embedding = c, .max_embedding_seqs = 8});
  std::vector<ServeRequest> rs;
  for (int rep = 0; rep < 3; ++rep)
    for (const std::string& t : kTexts) rs.push_back(embedding_request(*m, t));
  const std::vector<std::shared_ptr<ServeStream>> embs = sched.submit_all(std::move(rs));
  for (size_t i = 0; i < embs.size(); ++i) {
    const Done d = drain(*embs[i]);
    EXPECT_EQ(d.finish, FinishReason::kStop) << d.error;
    EXPECT_EQ(d.embedding, want[i % kTexts.size()]) << i;
  }
}

TEST_P(EmbeddingScheduler, AnInputPreemptedMidPrefillIsRecomputedUnchanged) {
  // 6 pages; one prefill token a step. The stream (10 prompt tokens) decodes to 90 tokens,
  // all 6 pages; the first embedding input (45 tokens, 3 pages) is prefilled beside it from
  // its first decode step, and is preempted when the stream needs its fourth page, 39 steps
  // in, 6 before the input would finish.
  auto m = load(GetParam(), 96);
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  const std::vector<float> want = alone(*m, c, kTexts[1]);
  const std::vector<int32_t> prompt = {97, 98, 99, 100, 101, 102, 103, 104, 105, 106};
  GenerateOptions g;
  g.max_new_tokens = 80;
  g.ignore_eos = true;
  const GenerateResult gen = Session(*m).generate(prompt, g);
  Scheduler sched(*m, {.prefill_chunk = 1, .embedding = c, .max_embedding_seqs = 1});
  ServeRequest r;
  r.prompt = prompt;
  r.max_tokens = 80;
  r.ignore_eos = true;
  // One submit_all: the stream and the first input are admitted in the same pass (submitted
  // apart, the stream could run past the point where the input fits beside it).
  std::vector<ServeRequest> rs;
  rs.push_back(std::move(r));
  for (int i = 0; i < 3; ++i) rs.push_back(embedding_request(*m, kTexts[1]));
  std::vector<std::shared_ptr<ServeStream>> embs = sched.submit_all(std::move(rs));
  const std::shared_ptr<ServeStream> stream = embs.front();
  embs.erase(embs.begin());
  for (auto& e : embs) {
    const Done d = drain(*e);
    EXPECT_EQ(d.finish, FinishReason::kStop) << d.error;
    EXPECT_EQ(d.embedding, want);
  }
  EXPECT_EQ(drain(*stream).tokens, gen.tokens);
  EXPECT_GT(sched.stats().preemptions, 0);
}

TEST_P(EmbeddingScheduler, EmbeddingsBesideSpeculativeDecodingGetNoDrafts) {
  auto m = load(GetParam());
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  std::vector<std::vector<float>> want;
  for (const std::string& t : kTexts) want.push_back(alone(*m, c, t));
  // A repetitive prompt, so the n-gram drafter has something to propose.
  const std::vector<int32_t> prompt =
      m->tokenizer()->encode("a b c a b c a b c a b c a b c a b", false);
  GenerateOptions g;
  g.max_new_tokens = 24;
  g.ignore_eos = true;
  const GenerateResult gen = Session(*m).generate(prompt, g);

  SpeculationOptions spec{.proposer = std::make_shared<speculative::NgramProposer>(),
                          .ladder = speculative::DraftLadder::constant(3)};
  Scheduler sched(*m, {.max_seqs = 2,
                       .prefill_chunk = 5,
                       .speculation = spec,
                       .embedding = c,
                       .max_embedding_seqs = 2});
  ServeRequest r;
  r.prompt = prompt;
  r.max_tokens = 24;
  r.ignore_eos = true;
  std::shared_ptr<ServeStream> stream = sched.submit(std::move(r));
  std::vector<ServeRequest> rs;
  for (const std::string& t : kTexts) rs.push_back(embedding_request(*m, t));
  const std::vector<std::shared_ptr<ServeStream>> embs = sched.submit_all(std::move(rs));
  for (size_t i = 0; i < embs.size(); ++i) {
    const Done d = drain(*embs[i]);
    EXPECT_EQ(d.finish, FinishReason::kStop) << d.error;
    EXPECT_EQ(d.embedding, want[i]) << i;
    EXPECT_FALSE(d.usage.speculative) << i;
    EXPECT_EQ(d.usage.draft_tokens, 0) << i;
  }
  const Done d = drain(*stream);
  EXPECT_EQ(d.tokens, gen.tokens);
  EXPECT_TRUE(d.usage.speculative);
  EXPECT_GT(d.usage.draft_tokens, 0);  // the decode rows did speculate
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EmbeddingScheduler, ::testing::Values("lasttoken", "mean"));

TEST(EmbeddingSchedulerCache, OnlyLastTokenPoolingAdoptsACachedPrefix) {
  for (const char* name : {"lasttoken", "mean"}) {
    auto m = load(name);
    const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
    Scheduler sched(*m, {.embedding = c});
    const std::string text = kTexts[2];  // 88 or 89 tokens: several whole pages
    const Done first = drain(*sched.submit(embedding_request(*m, text)));
    const Done again = drain(*sched.submit(embedding_request(*m, text)));
    EXPECT_EQ(first.usage.cached_tokens, 0);
    EXPECT_EQ(again.embedding, first.embedding) << name;
    if (c.pooling == Pooling::kLastToken) {
      EXPECT_EQ(again.usage.cached_tokens, 80) << name;  // 5 whole pages, the last token run
    } else {
      EXPECT_EQ(again.usage.cached_tokens, 0) << name;
    }
  }
}

TEST(EmbeddingSchedulerCache, AnInputFillingTheWholeKvCacheRuns) {
  auto m = load("lasttoken", 96);  // 6 pages; the context is 96 tokens too
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  const std::vector<std::vector<int32_t>> ids = {std::vector<int32_t>(96, 97)};
  const std::vector<float> want = embed(*m, c, ids).front();
  Scheduler sched(*m, {.embedding = c});
  ServeRequest r;
  r.prompt = ids[0];
  r.embedding = EmbeddingParams{};
  const Done d = drain(*sched.submit(std::move(r)));
  EXPECT_EQ(d.finish, FinishReason::kStop) << d.error;
  EXPECT_EQ(d.embedding, want);
}

TEST(EmbeddingSchedulerErrors, AGroupIsQueuedWholeOrRefused) {
  auto m = load("lasttoken");
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  auto error_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.message();
    }
    return std::string();
  };
  {
    Scheduler plain(*m, {});
    EXPECT_EQ(error_of([&] { plain.submit(embedding_request(*m, "x")); }),
              "this scheduler serves no embeddings");
  }
  const std::vector<float> want = alone(*m, c, kTexts[0]);
  Scheduler sched(*m, {.embedding = c});
  auto group = [&](ServeRequest bad) {
    std::vector<ServeRequest> rs;
    rs.push_back(embedding_request(*m, "fine"));
    rs.push_back(std::move(bad));
    return error_of([&] { sched.submit_all(std::move(rs)); });
  };
  ServeRequest empty = embedding_request(*m, "x");
  empty.prompt.clear();
  EXPECT_EQ(group(empty), "the input is empty");
  EXPECT_EQ(group(embedding_request(*m, std::string(200, 'a'))),
            "the input has 201 tokens; at most 128 fit (the model's max_seq_length)");
  EXPECT_EQ(group(embedding_request(*m, "x", 33)),
            "dimensions 33 is outside [1, 32] (the model's embedding has 32 values)");
  ServeRequest bad_id = embedding_request(*m, "x");
  bad_id.prompt[0] = 5000;
  EXPECT_EQ(group(bad_id), "input token 0 is 5000, outside the vocabulary [0, 272)");
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.waiting + st.running + st.requests_finished, 0);  // nothing was queued

  // A cancelled input ends as cancelled; the scheduler keeps serving.
  std::shared_ptr<ServeStream> s = sched.submit(embedding_request(*m, kTexts[1]));
  s->cancel();
  const Done d = drain(*s);
  EXPECT_TRUE(d.finish == FinishReason::kCancelled || d.finish == FinishReason::kStop);
  EXPECT_EQ(drain(*sched.submit(embedding_request(*m, kTexts[0]))).embedding, want);
}

}  // namespace
}  // namespace metrale
