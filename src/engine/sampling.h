#pragma once
// Token sampling on host logits, following HuggingFace generate(): the repetition penalty
// (a logits processor) first, then the warpers in HF's order — temperature, top-k, top-p,
// min-p — then softmax and one draw. Filtered logits become -inf as in HF. HF's semantics:
//  - repetition penalty: each distinct seen token's logit is divided by the penalty when
//    positive, multiplied by it when negative;
//  - top-k keeps every logit >= the k-th largest (ties at the boundary survive);
//  - top-p sorts ascending and drops the tokens whose cumulative probability is
//    <= 1 - top_p, always keeping the most likely one;
//  - min-p drops tokens whose probability is < min_p * (top probability), keeping at least
//    one.
// The RNG is ours (xoshiro256**), so a seed reproduces a run of metrale, not of torch.
#include <cstdint>
#include <span>
#include <vector>

namespace metrale {

struct SamplingParams {
  // <= 0 means greedy (argmax; HF do_sample=False). Note HF's GenerationConfig defaults
  // top_k to 50; callers that want HF's defaults set it themselves.
  float temperature = 1.0f;
  int64_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // >= 1: off
  float min_p = 0.0f;               // <= 0: off
  float repetition_penalty = 1.0f;  // 1: off
};

// xoshiro256** seeded through splitmix64: deterministic given the seed, on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next();
  float uniform();  // [0, 1) with 24 random bits

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  // Scratch sized once for the vocabulary, so sample() allocates nothing.
  explicit Sampler(int64_t vocab_size);

  // Applies the processors to `logits` in place (so callers can inspect them) and draws a
  // token. `seen` are the ids the repetition penalty applies to (prompt + generated, as
  // HF's input_ids); duplicates count once. Throws on a size mismatch, an id out of range,
  // or parameters outside their domain (top_p <= 0, negative top_k, penalty <= 0).
  int32_t sample(std::span<float> logits, const SamplingParams& params,
                 std::span<const int32_t> seen, Rng& rng);

  // The processors alone (no draw): what sample() draws from.
  void process(std::span<float> logits, const SamplingParams& params,
               std::span<const int32_t> seen);

 private:
  int64_t vocab_;
  std::vector<int32_t> order_;   // token ids, sorted by logit
  std::vector<float> probs_;     // softmax scratch
  std::vector<uint8_t> marked_;  // repetition-penalty dedup
};

}  // namespace metrale
