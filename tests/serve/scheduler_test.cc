// The continuous-batching scheduler: every stream equals the same request run alone
// (Session::generate), whatever else shares its steps — chunked prefill beside decode rows,
// streams joining and leaving, preemption when the KV cache runs out — plus cancellation,
// timeouts, admission control and request validation.
#include "serve/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "engine/session.h"
#include "lora/lora_pool.h"
#include "prefix_test_util.h"

namespace metrale {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Model> load_demo(int64_t kv_tokens = 1024, int64_t max_rows = 64) {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = kv_tokens;
  o.max_rows = max_rows;
  return Model::load("models/demo", o);
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kStop;
  std::string error;
  ServeUsage usage;
  std::vector<TokenLogprob> logprobs;
  int events = 0;
};

// Collects a stream's events until its last one (fails the test after 60 s).
Outcome drain(ServeStream& s) {
  Outcome o;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  std::vector<ServeEvent> events;
  for (;;) {
    events.clear();
    if (!s.next(events, 100ms)) {
      if (std::chrono::steady_clock::now() > give_up) {
        ADD_FAILURE() << "stream " << s.id() << " never finished";
        return o;
      }
      continue;
    }
    for (ServeEvent& e : events) {
      ++o.events;
      o.tokens.insert(o.tokens.end(), e.tokens.begin(), e.tokens.end());
      o.text += e.text;
      for (TokenLogprob& lp : e.logprobs) o.logprobs.push_back(std::move(lp));
      if (e.done) {
        o.finish = e.finish;
        o.error = e.error;
        o.usage = e.usage;
        return o;
      }
    }
  }
}

// The scheduler's figures once it has gone idle (its last events may arrive just before).
SchedulerStats settled(const Scheduler& sched) {
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  SchedulerStats st = sched.stats();
  while ((st.running != 0 || st.waiting != 0) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(2ms);
    st = sched.stats();
  }
  return st;
}

std::vector<int32_t> encode(const Model& m, const std::string& text) {
  return m.tokenizer()->encode(text, /*add_special_tokens=*/false);
}

const std::vector<std::string> kPrompts = {
    "And God said",
    "In the beginning God created the heaven and the earth. And the earth was without form",
    "And the evening and the morning were the third day.",
    "Let there be light",
    "And God called the light Day, and the darkness he called Night. And the evening and the "
    "morning were the first day. And God said, Let there be a firmament in the midst of the "
    "waters",
    "the",
    "And God made two great lights; the greater light to rule the day",
    "And God blessed them, saying, Be fruitful, and multiply",
};

GenerateResult alone(Model& m, const std::vector<int32_t>& prompt, int64_t max_tokens,
                     const std::vector<std::string>& stop = {}) {
  GenerateOptions g;
  g.max_new_tokens = max_tokens;
  g.stop_strings = stop;
  Session s(m);
  return s.generate(prompt, g);
}

TEST(Scheduler, ConcurrentGreedyStreamsEqualEachRequestRunAlone) {
  auto model = load_demo();
  std::vector<GenerateResult> want;
  for (size_t i = 0; i < kPrompts.size(); ++i)
    want.push_back(alone(*model, encode(*model, kPrompts[i]), 8 + 5 * static_cast<int64_t>(i)));

  // Small prefill chunks and few stream slots: prompts are prefilled in pieces beside decode
  // rows, and requests wait in the queue for a slot.
  Scheduler sched(*model, {.max_seqs = 3, .prefill_chunk = 7});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ServeRequest r;
    r.prompt = encode(*model, kPrompts[i]);
    r.max_tokens = 8 + 5 * static_cast<int64_t>(i);
    streams.push_back(sched.submit(std::move(r)));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const Outcome got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "prompt " << i;
    EXPECT_EQ(got.text, want[i].text) << "prompt " << i;
    EXPECT_EQ(got.finish,
              want[i].stop == StopReason::kEos ? FinishReason::kStop : FinishReason::kLength)
        << "prompt " << i;
    EXPECT_EQ(got.usage.prompt_tokens, static_cast<int64_t>(encode(*model, kPrompts[i]).size()));
    EXPECT_GE(got.usage.completion_tokens, static_cast<int64_t>(got.tokens.size()));
  }
  const SchedulerStats st = settled(sched);
  EXPECT_EQ(st.requests_finished, static_cast<int64_t>(kPrompts.size()));
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_pages_free + st.cache.pages_held, st.kv_pages_total);
}

TEST(Scheduler, StopStringsCutTheTextAsSessionDoes) {
  auto model = load_demo();
  const std::vector<int32_t> prompt = encode(*model, kPrompts[0]);
  const GenerateResult full = alone(*model, prompt, 24);
  ASSERT_GE(full.text.size(), 8u) << full.text;
  // A stop string from the middle of the greedy text, and one that never occurs.
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  const GenerateResult want = alone(*model, prompt, 24, {stop, "never-in-the-text"});
  ASSERT_EQ(want.stop, StopReason::kStopString);

  Scheduler sched(*model, {.max_seqs = 2});
  ServeRequest r;
  r.prompt = prompt;
  r.max_tokens = 24;
  r.stop = {stop, "never-in-the-text"};
  const Outcome got = drain(*sched.submit(r));
  EXPECT_EQ(got.finish, FinishReason::kStop);
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.text.find(stop), std::string::npos);
}

TEST(Scheduler, SeededSamplingIsReproducibleInAnyCompany) {
  auto model = load_demo();
  ServeRequest r;
  r.prompt = encode(*model, kPrompts[1]);
  r.max_tokens = 20;
  r.sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f};
  r.seed = 1234;
  Outcome solo;
  {
    Scheduler sched(*model, {.max_seqs = 4});
    solo = drain(*sched.submit(r));
  }
  Scheduler sched(*model, {.max_seqs = 4, .prefill_chunk = 5});
  std::vector<std::shared_ptr<ServeStream>> others;
  for (int i = 0; i < 3; ++i) {
    ServeRequest o = r;
    o.seed = 99 + static_cast<uint64_t>(i);
    others.push_back(sched.submit(std::move(o)));
  }
  const Outcome again = drain(*sched.submit(r));
  EXPECT_EQ(again.tokens, solo.tokens);
  EXPECT_EQ(again.text, solo.text);
  for (auto& s : others) drain(*s);
}

TEST(Scheduler, LogprobsAreTheModelsLogSoftmax) {
  auto model = load_demo();
  const std::vector<int32_t> prompt = encode(*model, kPrompts[3]);
  Scheduler sched(*model, {});
  ServeRequest r;
  r.prompt = prompt;
  r.max_tokens = 6;
  r.ignore_eos = true;
  r.top_logprobs = 3;
  const Outcome got = drain(*sched.submit(r));
  ASSERT_EQ(got.logprobs.size(), got.tokens.size());
  ASSERT_EQ(got.tokens.size(), 6u);

  // The first token's logprobs from the model's own logits.
  std::vector<float> logits(static_cast<size_t>(model->vocab_size()));
  Sequence seq;
  model->prefill(seq, prompt, logits);
  model->release(seq);
  double sum = 0;
  float mx = logits[0];
  for (float x : logits) mx = std::max(mx, x);
  for (float x : logits) sum += std::exp(static_cast<double>(x - mx));
  const double lse = mx + std::log(sum);
  const TokenLogprob& first = got.logprobs[0];
  EXPECT_EQ(first.id, got.tokens[0]);
  EXPECT_NEAR(first.logprob, logits[static_cast<size_t>(got.tokens[0])] - lse, 1e-4);
  for (const TokenLogprob& lp : got.logprobs) {
    ASSERT_EQ(lp.top.size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(lp.top[0].first, lp.id);
    EXPECT_FLOAT_EQ(lp.top[0].second, lp.logprob);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
    EXPECT_LE(lp.logprob, 0.0f);
  }
}

// OpenAI's penalties: each generated token's logit drops by presence_penalty once and by
// frequency_penalty per occurrence, before the greedy pick; the reference applies that by hand
// to the model's own logits.
TEST(Scheduler, PresenceAndFrequencyPenaltiesFollowOpenAi) {
  auto model = load_demo();
  const std::vector<int32_t> prompt = encode(*model, kPrompts[0]);
  const float presence = 0.7f, frequency = 1.3f;
  std::vector<int32_t> want;
  {
    const auto V = static_cast<size_t>(model->vocab_size());
    std::vector<float> logits(V);
    std::vector<int> count(V, 0);
    Sequence seq;
    model->prefill(seq, prompt, logits);
    for (int step = 0; step < 24; ++step) {
      for (size_t id = 0; id < V; ++id) {
        if (count[id] > 0) logits[id] -= presence + frequency * static_cast<float>(count[id]);
      }
      const auto next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      want.push_back(next);
      ++count[static_cast<size_t>(next)];
      Sequence* one = &seq;
      model->decode({&one, 1}, {&next, 1}, logits);
    }
    model->release(seq);
  }
  Scheduler sched(*model, {});
  ServeRequest r;
  r.prompt = prompt;
  r.max_tokens = 24;
  r.ignore_eos = true;
  r.presence_penalty = presence;
  r.frequency_penalty = frequency;
  const Outcome got = drain(*sched.submit(r));
  EXPECT_EQ(got.tokens, want);
  r.presence_penalty = r.frequency_penalty = 0;
  EXPECT_NE(drain(*sched.submit(r)).tokens, want) << "the penalties should change the greedy run";
  r.frequency_penalty = 2.5f;
  EXPECT_THROW(sched.submit(r), Error);
}

// OpenAI's logit_bias, added to the logits before the greedy pick: +100 forces a token, -100
// on the greedy choice makes the pick the runner-up of the model's own logits.
TEST(Scheduler, LogitBiasForcesAndBansTokens) {
  auto model = load_demo();
  const std::vector<int32_t> prompt = encode(*model, kPrompts[0]);
  const auto V = static_cast<size_t>(model->vocab_size());
  std::vector<float> logits(V);
  {
    Sequence seq;
    model->prefill(seq, prompt, logits);
    model->release(seq);
  }
  const auto best =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // The runner-up: the greedy pick once `best` loses 100 (the same arithmetic as the scheduler).
  std::vector<float> banned = logits;
  banned[static_cast<size_t>(best)] += -100.0f;
  const auto runner_up =
      static_cast<int32_t>(std::max_element(banned.begin(), banned.end()) - banned.begin());
  ASSERT_NE(runner_up, best);

  Scheduler sched(*model, {});
  ServeRequest r;
  r.prompt = prompt;
  r.max_tokens = 6;
  r.ignore_eos = true;
  r.top_logprobs = 1;
  const Outcome plain = drain(*sched.submit(r));
  ASSERT_FALSE(plain.tokens.empty());
  EXPECT_EQ(plain.tokens[0], best);

  // +100 on a token the unbiased run does not pick first: every generated token is that one.
  const int32_t forced = encode(*model, " LORD").back();
  ASSERT_NE(forced, best);
  r.logit_bias = {{forced, 100.0f}};
  const Outcome all = drain(*sched.submit(r));
  EXPECT_EQ(all.tokens, std::vector<int32_t>(6, forced));
  // Reported logprobs are the model's own, not biased (vLLM's default).
  ASSERT_EQ(all.logprobs.size(), 6u);
  EXPECT_LT(all.logprobs[0].logprob, 0.0f);
  EXPECT_NE(all.logprobs[0].top[0].first, forced);

  r.logit_bias = {{best, -100.0f}};
  const Outcome second = drain(*sched.submit(r));
  ASSERT_FALSE(second.tokens.empty());
  EXPECT_EQ(second.tokens[0], runner_up);
  // The first token's logprobs are still those of the unbiased logits.
  EXPECT_EQ(second.logprobs[0].top[0].first, best);
  EXPECT_FLOAT_EQ(second.logprobs[0].top[0].second, plain.logprobs[0].top[0].second);

  // Bad biases are refused at submit, naming logit_bias.
  for (const auto& bad : std::vector<std::vector<std::pair<int32_t, float>>>{
           {{static_cast<int32_t>(V), 1.0f}},
           {{-1, 1.0f}},
           {{5, 101.0f}},
           {{5, NAN}},
           {{5, 1.0f}, {5, 2.0f}},
       }) {
    r.logit_bias = bad;
    try {
      sched.submit(r);
      ADD_FAILURE() << "accepted a bad logit_bias";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("logit_bias"), std::string::npos) << e.what();
    }
  }
  r.logit_bias.assign(kMaxLogitBias + 1, {1, 1.0f});
  EXPECT_THROW(sched.submit(r), Error);
}

// One stream's bias is its own: a biased and an unbiased request decoding together each equal
// that request run alone.
TEST(Scheduler, LogitBiasDoesNotLeakBetweenStreams) {
  auto model = load_demo();
  Scheduler sched(*model, {.max_seqs = 4});
  ServeRequest plain;
  plain.prompt = encode(*model, kPrompts[1]);
  plain.max_tokens = 12;
  plain.ignore_eos = true;
  ServeRequest biased;
  biased.prompt = encode(*model, kPrompts[0]);
  biased.max_tokens = 12;
  biased.ignore_eos = true;
  const Outcome plain_alone = drain(*sched.submit(plain));
  const Outcome unbiased_alone = drain(*sched.submit(biased));
  // Ban the token the request picks first unbiased, and favour another; give the other
  // request's first token a bias too, which must not reach it.
  biased.logit_bias = {{unbiased_alone.tokens[0], -100.0f},
                       {encode(*model, " LORD").back(), 7.5f},
                       {plain_alone.tokens[0], -100.0f}};
  std::sort(biased.logit_bias.begin(), biased.logit_bias.end());
  biased.logit_bias.erase(
      std::unique(biased.logit_bias.begin(), biased.logit_bias.end(),
                  [](const auto& x, const auto& y) { return x.first == y.first; }),
      biased.logit_bias.end());
  const Outcome biased_alone = drain(*sched.submit(biased));
  ASSERT_NE(biased_alone.tokens, unbiased_alone.tokens) << "the bias should change the output";

  // Together (the same step, several times over, in both orders).
  for (int round = 0; round < 2; ++round) {
    std::shared_ptr<ServeStream> a, b;
    if (round == 0) {
      a = sched.submit(biased);
      b = sched.submit(plain);
    } else {
      b = sched.submit(plain);
      a = sched.submit(biased);
    }
    EXPECT_EQ(drain(*a).tokens, biased_alone.tokens) << "round " << round;
    EXPECT_EQ(drain(*b).tokens, plain_alone.tokens) << "round " << round;
  }
}

TEST(Scheduler, PreemptionWhenTheKvCacheRunsOutKeepsEveryStreamUnchanged) {
  // 8 pages of 16 tokens for 3 streams that each grow to ~60 tokens: decode runs out of
  // pages, the youngest stream is preempted and later recomputed.
  auto model = load_demo(/*kv_tokens=*/128);
  std::vector<GenerateResult> want;
  for (int i = 0; i < 3; ++i) {
    GenerateOptions g;
    g.max_new_tokens = 40;
    g.ignore_eos = true;
    Session s(*model);
    want.push_back(s.generate(encode(*model, kPrompts[static_cast<size_t>(i)]), g));
  }
  Scheduler sched(*model, {.max_seqs = 3});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (int i = 0; i < 3; ++i) {
    ServeRequest r;
    r.prompt = encode(*model, kPrompts[static_cast<size_t>(i)]);
    r.max_tokens = 40;
    r.ignore_eos = true;
    streams.push_back(sched.submit(std::move(r)));
  }
  for (int i = 0; i < 3; ++i) {
    const Outcome got = drain(*streams[static_cast<size_t>(i)]);
    EXPECT_EQ(got.tokens, want[static_cast<size_t>(i)].tokens) << i;
    EXPECT_EQ(got.text, want[static_cast<size_t>(i)].text) << i;
    EXPECT_EQ(got.finish, FinishReason::kLength);
  }
  EXPECT_GT(sched.stats().preemptions, 0);
}

TEST(Scheduler, PromptsThatTogetherOverflowTheKvCacheTakeTurns) {
  // 16 pages of 16 tokens; four 100-token prompts need 7 pages each. Admission counts the
  // pages admitted streams will still take for their prompts (a regression: it counted only
  // the free pages, admitted all four, and the first step preempted the youngest, which was
  // re-admitted at once, forever).
  auto model = load_demo(/*kv_tokens=*/256, /*max_rows=*/512);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<GenerateResult> want;
  for (uint32_t i = 0; i < 4; ++i) {
    prompts.push_back(serve_test::random_ids(100, 11 + i, 2000));
    GenerateOptions g;
    g.max_new_tokens = 8;
    g.ignore_eos = true;
    Session s(*model);
    want.push_back(s.generate(prompts.back(), g));
  }
  Scheduler sched(*model, {.max_seqs = 4, .prefill_chunk = 512});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (const auto& p : prompts) {
    ServeRequest r;
    r.prompt = p;
    r.max_tokens = 8;
    r.ignore_eos = true;
    r.timeout = 60s;  // a livelock ends here as kTimeout instead of hanging the test
    streams.push_back(sched.submit(std::move(r)));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const Outcome got = drain(*streams[i]);
    EXPECT_EQ(got.finish, FinishReason::kLength) << i;
    EXPECT_EQ(got.tokens, want[i].tokens) << i;
  }
  EXPECT_LT(sched.stats().preemptions, 16);
}

TEST(Scheduler, CancelFreesTheSequenceAndTimeoutsEndStreams) {
  auto model = load_demo();
  Scheduler sched(*model, {.max_seqs = 2});
  ServeRequest r;
  r.prompt = encode(*model, kPrompts[0]);
  r.max_tokens = 100000;
  r.ignore_eos = true;
  auto long_one = sched.submit(r);
  std::vector<ServeEvent> first;
  while (first.empty()) long_one->next(first, 100ms);
  long_one->cancel();
  const Outcome got = drain(*long_one);
  EXPECT_EQ(got.finish, FinishReason::kCancelled);

  ServeRequest t = r;
  t.timeout = 1ms;
  const Outcome late = drain(*sched.submit(t));
  EXPECT_EQ(late.finish, FinishReason::kTimeout);

  // Every page is back (in the pool, or held by the prefix cache for reuse).
  const SchedulerStats st = settled(sched);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.requests_cancelled, 1);
  EXPECT_EQ(st.requests_timed_out, 1);
  EXPECT_EQ(st.kv_pages_free + st.cache.pages_held, st.kv_pages_total);
}

TEST(Scheduler, AFullQueueRefusesWithSchedulerBusy) {
  auto model = load_demo();
  Scheduler sched(*model, {.max_seqs = 1, .max_queue = 2});
  ServeRequest r;
  r.prompt = encode(*model, kPrompts[0]);
  r.max_tokens = 100000;
  r.ignore_eos = true;
  std::vector<std::shared_ptr<ServeStream>> accepted;
  bool refused = false;
  for (int i = 0; i < 8 && !refused; ++i) {
    try {
      accepted.push_back(sched.submit(r));
    } catch (const SchedulerBusy& e) {
      refused = true;
      EXPECT_FALSE(e.stopping());
      EXPECT_NE(std::string(e.what()).find("busy"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(refused);
  EXPECT_GE(sched.stats().requests_rejected, 1);
  for (auto& s : accepted) s->cancel();
  for (auto& s : accepted) EXPECT_EQ(drain(*s).finish, FinishReason::kCancelled);
}

TEST(Scheduler, BadRequestsAreRefusedAtSubmit) {
  auto model = load_demo(/*kv_tokens=*/64);
  Scheduler sched(*model, {});
  auto refused = [&](ServeRequest r, const std::string& words) {
    try {
      sched.submit(std::move(r));
      ADD_FAILURE() << "accepted; expected an error with '" << words << "'";
    } catch (const SchedulerBusy&) {
      ADD_FAILURE() << "busy; expected an error with '" << words << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  ServeRequest ok;
  ok.prompt = {1, 2, 3};
  ServeRequest r = ok;
  r.prompt.clear();
  refused(r, "empty");
  r = ok;
  r.prompt[1] = static_cast<int32_t>(model->vocab_size());
  refused(r, "outside the vocabulary");
  r = ok;
  r.prompt[1] = -1;
  refused(r, "outside the vocabulary");
  r = ok;
  r.max_tokens = 0;
  refused(r, "max_tokens");
  r = ok;
  r.sampling.top_p = 0;
  refused(r, "top_p");
  r = ok;
  r.sampling.temperature = NAN;
  refused(r, "temperature");
  r = ok;
  r.sampling.min_p = 2;
  refused(r, "min_p");
  r = ok;
  r.top_logprobs = 21;
  refused(r, "top_logprobs");
  r = ok;
  r.stop = {""};
  refused(r, "stop string");
  r = ok;
  r.prompt.assign(static_cast<size_t>(model->context_limit()), 5);
  refused(r, "context");
  // The scheduler still serves.
  ok.max_tokens = 3;
  ok.ignore_eos = true;
  EXPECT_EQ(drain(*sched.submit(ok)).tokens.size(), 3u);
}

TEST(Scheduler, UnknownAdapterEndsTheStreamWithAnError) {
  auto model = load_demo();
  Scheduler sched(*model, {});
  ServeRequest r;
  r.prompt = {1, 2, 3};
  r.adapter = "nope";
  const Outcome got = drain(*sched.submit(r));
  EXPECT_EQ(got.finish, FinishReason::kError);
  EXPECT_NE(got.error.find("nope"), std::string::npos) << got.error;
}

}  // namespace
}  // namespace metrale

namespace metrale {
namespace {

// A long shared system prompt, then distinct questions: with the prefix cache on, later
// requests adopt the shared pages (usage.cached_tokens) and every stream is what it is with
// the cache off — both runs concurrent, chunked, in any order.
TEST(SchedulerPrefixCache, SharedPrefixHitsAndOutputsEqualTheCacheOff) {
  auto model = load_demo();
  const std::string system =
      "In the beginning God created the heaven and the earth. And the earth was without form, "
      "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon "
      "the face of the waters. And God said, Let there be light: and there was light. ";
  std::vector<ServeRequest> requests;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ServeRequest r;
    r.prompt = encode(*model, system + kPrompts[i]);
    r.max_tokens = 12;
    r.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  auto run = [&](bool cache_on) {
    SchedulerOptions o{.max_seqs = 3, .prefill_chunk = 24};
    o.cache.enabled = cache_on;
    Scheduler sched(*model, o);
    std::vector<Outcome> out;
    // The first request alone fills the cache; the rest run concurrently.
    out.push_back(drain(*sched.submit(requests[0])));
    std::vector<std::shared_ptr<ServeStream>> streams;
    for (size_t i = 1; i < requests.size(); ++i) streams.push_back(sched.submit(requests[i]));
    for (auto& s : streams) out.push_back(drain(*s));
    return std::pair(out, settled(sched));
  };
  const auto [off, off_stats] = run(false);
  const auto [on, on_stats] = run(true);
  int64_t cached = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(on[i].tokens, off[i].tokens) << i;
    EXPECT_EQ(on[i].text, off[i].text) << i;
    EXPECT_EQ(off[i].usage.cached_tokens, 0);
    cached += on[i].usage.cached_tokens;
    EXPECT_EQ(on[i].usage.cached_tokens % 16, 0) << "whole pages only";
  }
  EXPECT_EQ(on[0].usage.cached_tokens, 0);
  const int64_t shared = static_cast<int64_t>(encode(*model, system).size()) / 16 * 16;
  EXPECT_GE(cached, shared * static_cast<int64_t>(requests.size() - 1) / 2);
  EXPECT_EQ(off_stats.cache.hits, 0);
  EXPECT_GE(on_stats.cache.hits, static_cast<int64_t>(requests.size()) - 1);
  EXPECT_EQ(on_stats.cache.tokens_saved, cached);
  EXPECT_GT(on_stats.cache.bytes_held, 0u);
  EXPECT_LT(on_stats.prefill_tokens, off_stats.prefill_tokens);
  EXPECT_EQ(on_stats.kv_pages_free + on_stats.cache.pages_held, on_stats.kv_pages_total);
}

// A cache that fills the KV pool is evicted as new requests need pages; outputs unchanged.
TEST(SchedulerPrefixCache, CachedPagesGiveWayToNewRequests) {
  auto model = load_demo(/*kv_tokens=*/160);
  std::vector<ServeRequest> requests;
  std::vector<GenerateResult> want;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ServeRequest r;
    r.prompt = encode(*model, kPrompts[i] + " " + kPrompts[(i + 3) % kPrompts.size()]);
    r.max_tokens = 30;
    r.ignore_eos = true;
    GenerateOptions g;
    g.max_new_tokens = 30;
    g.ignore_eos = true;
    Session s(*model);
    want.push_back(s.generate(r.prompt, g));
    requests.push_back(std::move(r));
  }
  Scheduler sched(*model, {.max_seqs = 2});
  for (size_t i = 0; i < requests.size(); ++i) {
    const Outcome got = drain(*sched.submit(requests[i]));
    EXPECT_EQ(got.tokens, want[i].tokens) << i << ": " << got.error;
  }
  const SchedulerStats st = settled(sched);
  EXPECT_GT(st.cache.evicted_pages, 0);
  EXPECT_EQ(st.kv_pages_free + st.cache.pages_held, st.kv_pages_total);
}

}  // namespace
}  // namespace metrale

namespace metrale {
namespace {

// Streams with different LoRA adapters (and the base model) share steps; each equals its
// request run alone with its adapter, and a prefix cached under one adapter is not served
// to another (the same prompt under each adapter).
TEST(SchedulerLora, StreamsWithDifferentAdaptersEqualEachRunAlone) {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 512;
  auto model = Model::load("tests/data/fixtures/qwen3_f32", o);
  LoraPool& pool = model->enable_lora({.max_loras = 2, .max_rank = 16});
  pool.load("a", "tests/data/fixtures/lora/qwen3_dense/a", /*pinned=*/true);
  pool.load("b", "tests/data/fixtures/lora/qwen3_dense/b", /*pinned=*/true);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 40; ++i) prompt.push_back(3 + (i * 37) % 300);
  const std::vector<std::string> adapters = {"a", "b", "", "a", "b"};
  std::vector<GenerateResult> want;
  for (const std::string& name : adapters) {
    GenerateOptions g;
    g.max_new_tokens = 10;
    g.ignore_eos = true;
    Session s(*model, name);
    want.push_back(s.generate(prompt, g));
  }
  EXPECT_NE(want[0].tokens, want[1].tokens) << "the adapters should change the output";
  Scheduler sched(*model, {.max_seqs = 3, .prefill_chunk = 16});
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (const std::string& name : adapters) {
    ServeRequest r;
    r.prompt = prompt;
    r.max_tokens = 10;
    r.ignore_eos = true;
    r.adapter = name;
    streams.push_back(sched.submit(std::move(r)));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const Outcome got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << i << " (" << adapters[i] << "): " << got.error;
  }
}

}  // namespace
}  // namespace metrale
