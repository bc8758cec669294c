// Sampling: HF's processor semantics on small hand-checked distributions, and seeded
// determinism.
#include "engine/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace metrale {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> log_probs(const std::vector<float>& p) {
  std::vector<float> l;
  for (float x : p) l.push_back(std::log(x));
  return l;
}

TEST(Sampling, RepetitionPenaltyDividesPositiveMultipliesNegativeOnce) {
  Sampler s(4);
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.0f};
  const std::vector<int32_t> seen = {0, 1, 0, 3};
  s.process(logits, {.temperature = 0.0f, .repetition_penalty = 2.0f}, seen);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.0f}));
}

TEST(Sampling, TopKKeepsTiesAtTheBoundary) {
  Sampler s(5);
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 2.0f, 0.5f};
  s.process(logits, {.top_k = 2}, {});
  EXPECT_EQ(logits, (std::vector<float>{-kInf, 3.0f, 2.0f, 2.0f, -kInf}));
}

TEST(Sampling, TopPDropsTheLowTailWhoseMassIsAtMostOneMinusP) {
  // probs 0.5, 0.3, 0.15, 0.05: ascending cumulative 0.05, 0.20, 0.50, 1.0.
  Sampler s(4);
  std::vector<float> logits = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  s.process(logits, {.top_p = 0.75f}, {});  // drop cumulative <= 0.25: 0.05 and 0.15
  EXPECT_GT(logits[0], -kInf);
  EXPECT_GT(logits[1], -kInf);
  EXPECT_EQ(logits[2], -kInf);
  EXPECT_EQ(logits[3], -kInf);
  std::vector<float> tiny = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  s.process(tiny, {.top_p = 0.01f}, {});  // the most likely token always stays
  EXPECT_GT(tiny[0], -kInf);
  EXPECT_EQ(tiny[1], -kInf);
}

TEST(Sampling, MinPScalesByTheTopProbability) {
  Sampler s(4);
  std::vector<float> logits = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  s.process(logits, {.min_p = 0.35f}, {});  // threshold 0.175: keeps 0.5 and 0.3
  EXPECT_GT(logits[1], -kInf);
  EXPECT_EQ(logits[2], -kInf);
  EXPECT_EQ(logits[3], -kInf);
}

TEST(Sampling, TemperatureComesBeforeMinP) {
  // At temperature 0.5 the probabilities sharpen to 25:9:2.25:0.25 (normalised), so
  // min_p 0.35 drops token 1 too (9/25 = 0.36 stays; 2.25/25 = 0.09 goes).
  Sampler s(4);
  std::vector<float> logits = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  s.process(logits, {.temperature = 0.5f, .min_p = 0.35f}, {});
  EXPECT_GT(logits[1], -kInf);
  EXPECT_EQ(logits[2], -kInf);
  std::vector<float> colder = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  s.process(colder, {.temperature = 0.25f, .min_p = 0.35f}, {});  // (0.6)^4 = 0.13 < 0.35
  EXPECT_EQ(colder[1], -kInf);
}

TEST(Sampling, SeededDrawsAreDeterministicAndFollowTheDistribution) {
  Sampler s(4);
  const std::vector<float> base = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  std::vector<int> counts(4, 0);
  std::vector<int32_t> first, second;
  for (int run = 0; run < 2; ++run) {
    Rng rng(1234);
    for (int i = 0; i < 4000; ++i) {
      std::vector<float> l = base;
      const int32_t t = s.sample(l, {}, {}, rng);
      (run == 0 ? first : second).push_back(t);
      if (run == 0) ++counts[static_cast<size_t>(t)];
    }
  }
  EXPECT_EQ(first, second);
  EXPECT_NEAR(counts[0] / 4000.0, 0.5, 0.03);
  EXPECT_NEAR(counts[1] / 4000.0, 0.3, 0.03);
  EXPECT_NEAR(counts[3] / 4000.0, 0.05, 0.015);
  Rng other(1235);
  std::vector<int32_t> third;
  for (int i = 0; i < 64; ++i) {
    std::vector<float> l = base;
    third.push_back(s.sample(l, {}, {}, other));
  }
  EXPECT_NE(std::vector<int32_t>(first.begin(), first.begin() + 64), third);
}

TEST(Sampling, GreedyAndTopKOneAreArgmax) {
  Sampler s(5);
  Rng rng(1);
  std::vector<float> a = {0.1f, 0.7f, 0.7f, -1.0f, 0.2f};
  EXPECT_EQ(s.sample(a, {.temperature = 0.0f}, {}, rng), 1);
  std::vector<float> b = {0.1f, 0.9f, 0.7f, -1.0f, 0.2f};
  for (int i = 0; i < 20; ++i) {
    std::vector<float> l = b;
    EXPECT_EQ(s.sample(l, {.top_k = 1}, {}, rng), 1);
  }
}

TEST(Sampling, RejectsBadInput) {
  Sampler s(3);
  Rng rng(0);
  std::vector<float> l = {0, 1, 2};
  EXPECT_THROW(s.sample(l, {.top_p = 0.0f}, {}, rng), Error);
  EXPECT_THROW(s.sample(l, {.top_k = -1}, {}, rng), Error);
  const std::vector<int32_t> bad = {3};
  EXPECT_THROW(s.sample(l, {.repetition_penalty = 1.1f}, bad, rng), Error);
  std::vector<float> wrong(4);
  EXPECT_THROW(s.sample(wrong, {}, {}, rng), Error);
}

}  // namespace
}  // namespace metrale
