// LoadOptions::compute = kInt8 (int4 / int8 / nvfp4 weights meet activations quantized to int8
// per 32 packed positions, backend/cpu/linear_quant.h "Q8 layouts") on the quantized fixtures,
// against HF's f32 run on the producers' dequantized weights. The tolerance is that of every
// path that rounds activations (tests/data/fixtures/README.md: max abs 0.5, mean abs 0.05 on the
// logits), and greedy decoding follows HF's tokens except where HF's own top two are closer than
// the rounding noise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/session.h"
#include "fixture_util.h"
#include "rounding_checks.h"

namespace metrale {
namespace {

using testing::Reference;

LoadOptions int8_options() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 256;
  o.compute = Compute::kInt8;
  return o;
}

class Int8Compute : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8Compute, LogitsNearF32) {
  const Reference ref(GetParam());
  auto model = Model::load(testing::fixture_dir(GetParam()), int8_options());
  const std::vector<int32_t> ids = ref.ids("input_ids");
  std::vector<float> logits(ids.size() * static_cast<size_t>(model->vocab_size()));
  Sequence seq;
  model->prefill(seq, ids, logits, /*all_logits=*/true);
  model->release(seq);
  const std::vector<float> want = ref.floats("logits");
  ASSERT_EQ(want.size(), logits.size());
  double sum = 0.0;
  float max_abs = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    const float d = std::fabs(want[i] - logits[i]);
    ASSERT_TRUE(std::isfinite(d)) << "logit " << i;
    sum += d;
    max_abs = std::max(max_abs, d);
  }
  const double mean_abs = sum / static_cast<double>(want.size());
  RecordProperty("max_abs", std::to_string(max_abs));
  RecordProperty("mean_abs", std::to_string(mean_abs));
  EXPECT_LE(max_abs, 0.5f);
  EXPECT_LE(mean_abs, 0.05);
  // Not the f32 path in disguise: quantizing the activations must move the logits.
  EXPECT_GT(max_abs, 1e-4f);
}

// Greedy against HF's f32 run, within near ties (rounding_checks.h).
TEST_P(Int8Compute, GreedyPrefixMatchesF32) {
  const Reference ref(GetParam());
  auto model = Model::load(testing::fixture_dir(GetParam()), int8_options());
  testing::expect_greedy_prefix(*model, ref.ids("input_ids"), ref.ids("greedy_ids"));
}

// Every fixture whose weights have a q8 layout (int4, int8, nvfp4; fp8 checkpoints run their
// f32 layout under kInt8 and are covered by the f32 parity tests).
INSTANTIATE_TEST_SUITE_P(Quantized, Int8Compute,
                         ::testing::Values("quant_ct_w4a16", "quant_ct_w4a16_asym",
                                           "quant_ct_gptq_actorder", "quant_ct_w8a16",
                                           "quant_ct_mixed", "quant_ct_nvfp4a16",
                                           "quant_modelopt_nvfp4", "quant_modelopt_w4a16_nvfp4"));

}  // namespace
}  // namespace metrale
