// LoadOptions::compute = kBF16 (linear inputs rounded to bf16, backend/cpu/linear_pairs.h)
// against HF run natively in bf16: the fixture README's tolerance for paths that round
// activations (max abs 0.5, mean abs 0.05 on the logits; first 8 greedy ids exact).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/session.h"
#include "fixture_util.h"
#include "rounding_checks.h"

namespace metrale {
namespace {

using testing::Reference;

LoadOptions bf16_options() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 256;
  o.compute = Compute::kBF16;
  return o;
}

class Bf16Compute : public ::testing::TestWithParam<std::string> {};

struct Bf16Tolerance {
  float max_abs;          // per logit, on all but the allowed rows
  double mean_abs;        // over every logit
  double far_rows = 0.0;  // fraction of prompt rows allowed past max_abs
};
// The README's rounding-path tolerance; hybrid types get wider bounds, measured when the
// fixtures were made (tests/data/fixtures/README.md): HF's native bf16 run of a Gated DeltaNet
// model rounds the delta rule's inputs and the gated norm's 24-value groups (dense hybrids: max
// 0.49 / 0.63 measured), and in the MoE hybrids picks other experts than its f32 run for 11-20
// of the 80 prompt tokens, whose logits then move by O(1): those rows may exceed max_abs.
Bf16Tolerance bf16_tolerance(const std::string& fixture) {
  if (fixture == "qwen3_5_text_bf16" || fixture == "qwen3_5_bf16") return {1.0f, 0.1};
  if (fixture.starts_with("qwen3_next") || fixture.starts_with("qwen3_5")) return {1.0f, 0.2, 0.3};
  return {0.5f, 0.05};
}

TEST_P(Bf16Compute, LogitsNearNativeBf16) {
  const Reference ref(GetParam());
  auto model = Model::load(testing::fixture_dir(GetParam()), bf16_options());
  const std::vector<int32_t> ids = ref.ids("input_ids");
  std::vector<float> logits(ids.size() * static_cast<size_t>(model->vocab_size()));
  Sequence seq;
  model->prefill(seq, ids, logits, /*all_logits=*/true);
  model->release(seq);
  const std::vector<float> want = ref.floats("bf16_native.logits");
  ASSERT_EQ(want.size(), logits.size());
  const Bf16Tolerance tol = bf16_tolerance(GetParam());
  const auto V = static_cast<size_t>(model->vocab_size());
  double sum = 0.0;
  size_t far = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    float row_max = 0.0f;
    for (size_t i = r * V; i < (r + 1) * V; ++i) {
      const float d = std::fabs(want[i] - logits[i]);
      ASSERT_TRUE(std::isfinite(d)) << "logit " << i;
      sum += d;
      row_max = std::max(row_max, d);
    }
    far += row_max > tol.max_abs ? 1 : 0;
  }
  const double mean_abs = sum / static_cast<double>(want.size());
  EXPECT_LE(static_cast<double>(far), tol.far_rows * static_cast<double>(ids.size()))
      << far << " of " << ids.size() << " rows have a logit more than " << tol.max_abs
      << " from HF's native bf16";
  EXPECT_LE(mean_abs, tol.mean_abs);
  // Not the f32 path in disguise: rounding the activations must move the logits.
  const std::vector<float> f32 = ref.floats("logits");
  EXPECT_GT(testing::max_abs_diff(f32.data(), logits.data(), f32.size()), 1e-4f);
}

// Greedy against HF's native bf16 run. Both round, but not the same values (HF also rounds
// norms, residuals and attention in bf16), so a step whose top two logits are closer than the
// rounding noise may legitimately go either way: llama_bf16's first step is such a tie (f32
// logits 5.100 vs 5.089). rounding_checks.h says what is checked.
TEST_P(Bf16Compute, GreedyPrefixMatchesNativeBf16) {
  const Reference ref(GetParam());
  auto model = Model::load(testing::fixture_dir(GetParam()), bf16_options());
  testing::expect_greedy_prefix(*model, ref.ids("input_ids"), ref.ids("bf16_native.greedy_ids"));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16Compute,
                         ::testing::Values("llama_bf16", "qwen2_bf16", "qwen3_bf16",
                                           "qwen3_moe_bf16", "qwen3_moe_nonorm_bf16",
                                           "qwen3_next_bf16", "qwen3_5_text_bf16",
                                           "qwen3_5_moe_text_bf16", "qwen3_5_bf16",
                                           "qwen3_5_moe_bf16",
                                           // MLA + sigmoid routing; the other two MLA-family
                                           // fixtures were not chosen for this (their native bf16
                                           // runs route other experts than the f32 ones on some
                                           // prompt tokens: fixture README)
                                           "deepseek_v3_mtp_bf16", "glm4_moe_qknorm_bf16"));

TEST(Bf16ComputeOptions, InPlaceWeightsAreRejected) {
  LoadOptions o = bf16_options();
  o.placement = WeightPlacement::kInPlace;
  try {
    Model::load(testing::fixture_dir("qwen3_bf16"), o);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("placement copy"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace metrale
