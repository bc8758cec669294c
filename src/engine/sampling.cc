#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace metrale {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

int32_t first_argmax(std::span<const float> v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

// softmax of `logits` into `probs` (f32, max-subtracted, as torch's softmax).
void softmax(std::span<const float> logits, std::vector<float>& probs) {
  float mx = kNegInf;
  for (float x : logits) mx = std::max(mx, x);
  float sum = 0.0f;
  for (size_t i = 0; i < logits.size(); ++i) {
    probs[i] = logits[i] == kNegInf ? 0.0f : std::exp(logits[i] - mx);
    sum += probs[i];
  }
  for (size_t i = 0; i < logits.size(); ++i) probs[i] /= sum;
}

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }

Sampler::Sampler(int64_t vocab_size) : vocab_(vocab_size) {
  METRALE_CHECK(vocab_size > 0, "sampler: vocabulary size must be positive, found ", vocab_size);
  const auto n = static_cast<size_t>(vocab_size);
  order_.resize(n);
  probs_.resize(n);
  marked_.assign(n, 0);
}

void Sampler::process(std::span<float> logits, const SamplingParams& p,
                      std::span<const int32_t> seen) {
  METRALE_CHECK(static_cast<int64_t>(logits.size()) == vocab_, "sampler: expected ", vocab_,
                " logits, found ", logits.size());
  METRALE_CHECK(p.repetition_penalty > 0.0f, "sampling: repetition_penalty must be > 0, found ",
                p.repetition_penalty);
  METRALE_CHECK(p.top_k >= 0, "sampling: top_k must be >= 0, found ", p.top_k);
  METRALE_CHECK(p.top_p > 0.0f, "sampling: top_p must be in (0, 1], found ", p.top_p);
  METRALE_CHECK(p.min_p <= 1.0f, "sampling: min_p must be in [0, 1], found ", p.min_p);

  if (p.repetition_penalty != 1.0f) {
    for (int32_t id : seen) {
      METRALE_CHECK(id >= 0 && id < vocab_, "sampling: seen token id ", id,
                    " is outside the vocabulary [0, ", vocab_, ")");
      auto& m = marked_[static_cast<size_t>(id)];
      if (m) continue;  // HF gathers then scatters: a repeated id is penalised once
      m = 1;
      float& s = logits[static_cast<size_t>(id)];
      s = s < 0.0f ? s * p.repetition_penalty : s / p.repetition_penalty;
    }
    for (int32_t id : seen) marked_[static_cast<size_t>(id)] = 0;
  }
  if (p.temperature <= 0.0f) return;  // greedy: HF applies no warpers

  const auto n = logits.size();
  if (p.temperature != 1.0f) {
    for (float& s : logits) s /= p.temperature;
  }
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    // Threshold = k-th largest value; everything strictly below it goes (ties survive).
    for (size_t i = 0; i < n; ++i) order_[i] = static_cast<int32_t>(i);
    const auto kth = order_.begin() + (p.top_k - 1);
    std::nth_element(order_.begin(), kth, order_.begin() + static_cast<ptrdiff_t>(n),
                     [&](int32_t a, int32_t b) {
                       return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
                     });
    const float threshold = logits[static_cast<size_t>(*kth)];
    for (float& s : logits) {
      if (s < threshold) s = kNegInf;
    }
  }
  if (p.top_p < 1.0f) {
    // Ascending order over all tokens, as HF's sort(descending=False); removed tokens
    // (-inf) sort first and carry probability 0.
    softmax(logits, probs_);
    for (size_t i = 0; i < n; ++i) order_[i] = static_cast<int32_t>(i);
    std::stable_sort(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(n),
                     [&](int32_t a, int32_t b) {
                       return logits[static_cast<size_t>(a)] < logits[static_cast<size_t>(b)];
                     });
    const float limit = 1.0f - p.top_p;
    float cumulative = 0.0f;
    for (size_t j = 0; j + 1 < n; ++j) {  // the last (most likely) token always stays
      const auto id = static_cast<size_t>(order_[j]);
      cumulative += probs_[id];
      if (cumulative <= limit) logits[id] = kNegInf;
    }
  }
  if (p.min_p > 0.0f) {
    softmax(logits, probs_);
    const size_t top = static_cast<size_t>(first_argmax(logits));
    const float threshold = p.min_p * probs_[top];
    for (size_t i = 0; i < n; ++i) {
      if (i != top && probs_[i] < threshold) logits[i] = kNegInf;
    }
  }
}

int32_t Sampler::sample(std::span<float> logits, const SamplingParams& p,
                        std::span<const int32_t> seen, Rng& rng) {
  process(logits, p, seen);
  if (p.temperature <= 0.0f) return first_argmax(logits);
  softmax(logits, probs_);
  // Inverse CDF in token order; the draw scales by the actual sum so rounding in the
  // normalisation can never run off the end.
  float total = 0.0f;
  for (size_t i = 0; i < logits.size(); ++i) total += probs_[i];
  const float u = rng.uniform() * total;
  float cumulative = 0.0f;
  int32_t last_nonzero = first_argmax(logits);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (probs_[i] <= 0.0f) continue;
    cumulative += probs_[i];
    last_nonzero = static_cast<int32_t>(i);
    if (u < cumulative) return static_cast<int32_t>(i);
  }
  return last_nonzero;
}

}  // namespace metrale
