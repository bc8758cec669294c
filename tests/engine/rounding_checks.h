#pragma once
// Checks shared by the paths that round activations (--compute bf16 / int8): greedy decoding
// against a reference that did not round the same values (tests/data/fixtures/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/session.h"

namespace metrale::testing {

// Teacher-forced on the reference's first 8 greedy tokens (`want`): each step picks the
// reference's token, or that token is within 0.05 (the README's mean-abs tolerance for rounding
// paths) of the top — a near tie the rounding may break either way — at most one such step.
// When every step agrees, free-running generation (prefill + decode) gives the 8 tokens exactly.
inline void expect_greedy_prefix(Model& model, const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& want) {
  constexpr float kTieGap = 0.05f;
  constexpr size_t kSteps = 8;
  ASSERT_GE(want.size(), kSteps);
  std::vector<int32_t> ids = prompt;
  ids.insert(ids.end(), want.begin(), want.begin() + kSteps - 1);
  const auto V = static_cast<size_t>(model.vocab_size());
  std::vector<float> logits(ids.size() * V);
  Sequence seq;
  model.prefill(seq, ids, logits, /*all_logits=*/true);
  model.release(seq);
  int ties = 0;
  for (size_t i = 0; i < kSteps; ++i) {
    const float* row = logits.data() + (prompt.size() - 1 + i) * V;
    const auto top = static_cast<int32_t>(std::max_element(row, row + V) - row);
    if (top == want[i]) continue;
    ++ties;
    EXPECT_LT(row[top] - row[want[i]], kTieGap)
        << "step " << i << ": picked " << top << ", the reference picked " << want[i];
  }
  EXPECT_LE(ties, 1);
  if (ties == 0) {
    Session session(model);
    const GenerateResult r = session.generate(prompt, {.max_new_tokens = 16, .ignore_eos = true});
    ASSERT_EQ(r.tokens.size(), 16u);
    EXPECT_EQ(std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + kSteps),
              std::vector<int32_t>(want.begin(), want.begin() + kSteps));
  }
}

}  // namespace metrale::testing
