// Bad hybrid checkpoints (Gated DeltaNet layers): a config that contradicts the tensors gets an
// error naming the layer, tensor or field, expected vs found — never a crash or a wrong answer.
// (A state slot used by two sequences: hybrid_state_test.cc.)
#include <gtest/gtest.h>

#include "checkpoint_copy.h"
#include "core/error.h"
#include "engine/model.h"
#include "support/test_support.h"

namespace metrale {
namespace {

using test::error_of;
using testing::CheckpointCopy;

LoadOptions small() { return testing::small_load_options(); }

using testing::expect_has;
using testing::load_error;

TEST(HybridBadInput, LayerKindsContradictTheTensors) {
  CheckpointCopy c("qwen3_5_text_f32");
  c.replace_in_config(
      "\"linear_attention\",\n    \"linear_attention\",\n    \"linear_attention\",\n"
      "    \"full_attention\"",
      "\"full_attention\",\n    \"linear_attention\",\n    \"linear_attention\",\n"
      "    \"full_attention\"");
  const std::string msg = load_error(c);
  expect_has(msg, "layer_types says layer 0 is full_attention");
  expect_has(msg, "model.layers.0.linear_attn.out_proj.weight");
}

TEST(HybridBadInput, FullAttentionIntervalContradictsTheTensors) {
  CheckpointCopy c("qwen3_next_bf16");  // the Hub-style config: full_attention_interval
  c.replace_in_config("\"full_attention_interval\": 2", "\"full_attention_interval\": 4");
  expect_has(load_error(c), "layer_types says layer 1 is linear_attention");
}

TEST(HybridBadInput, HeadCountsContradictTheTensors) {
  CheckpointCopy c("qwen3_5_text_f32");
  c.replace_in_config("\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 6");
  const std::string msg = load_error(c);
  expect_has(msg, "model.layers.0.linear_attn.in_proj_qkv.weight");
  expect_has(msg, "has shape [160, 64], expected [208, 64]");
}

TEST(HybridBadInput, QwenNextGroupedProjectionContradictsTheHeads) {
  CheckpointCopy c("qwen3_next_f32");
  c.replace_in_config("\"linear_key_head_dim\": 16", "\"linear_key_head_dim\": 8");
  expect_has(load_error(c), "model.layers.0.linear_attn.in_proj_qkvz.weight' has shape [256, 64]");
}

TEST(HybridBadInput, ConvKernelContradictsTheTensors) {
  CheckpointCopy c("qwen3_5_text_f32");
  c.replace_in_config("\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 3");
  const std::string msg = load_error(c);
  expect_has(msg, "model.layers.0.linear_attn.conv1d.weight' has shape [160, 1, 4]");
  expect_has(msg, "expected [160, 1, 3]");
}

TEST(HybridBadInput, ExpertCountsContradictTheTensors) {
  {
    CheckpointCopy c("qwen3_5_moe_text_f32");
    c.replace_in_config("\"num_experts\": 8", "\"num_experts\": 6");
    expect_has(load_error(c),
               "'model.layers.0.mlp.gate.weight' has shape [8, 64], expected [6, 64]");
  }
  {
    CheckpointCopy c("qwen3_5_moe_text_f32");
    c.replace_in_config("\"num_experts\": 8", "\"num_experts\": 10");
    expect_has(load_error(c),
               "'model.layers.0.mlp.gate.weight' has shape [8, 64], expected [10, 64]");
  }
}

TEST(HybridBadInput, MissingSharedExpertGate) {
  CheckpointCopy c("qwen3_5_moe_text_f32");
  c.rewrite(
      [](const std::string& n) { return !n.ends_with("layers.2.mlp.shared_expert_gate.weight"); });
  expect_has(load_error(c), "missing tensor 'model.layers.2.mlp.shared_expert_gate.weight'");
}

TEST(HybridBadInput, WrongLengthDecayParameters) {
  CheckpointCopy c("qwen3_5_text_f32");
  c.rewrite_all([](SafetensorsWriter& w, const SafetensorsFile& f) {
    for (const auto& t : f.tensors()) {
      if (t.name == "model.layers.1.linear_attn.A_log") {
        w.add(t.name, t.dtype, Shape{3}, f.bytes(t).first(dtype_bytes(t.dtype, 3)));
      } else {
        w.add(t.name, t.dtype, t.shape, f.bytes(t));
      }
    }
  });
  expect_has(load_error(c),
             "tensor 'model.layers.1.linear_attn.A_log' has shape [3], expected [4]");
}

TEST(HybridBadInput, StateOptions) {
  LoadOptions o = small();
  o.state_dtype = DType::kBF16;
  EXPECT_THROW(Model::load(testing::fixture_dir("qwen3_next_f32"), o), Error);
  o = small();
  o.max_seqs = 0;
  EXPECT_THROW(Model::load(testing::fixture_dir("qwen3_next_f32"), o), Error);
  o = small();
  o.state_budget = 1000;  // smaller than one block per slot
  expect_has(error_of([&] { Model::load(testing::fixture_dir("qwen3_next_f32"), o); }),
             "exceed the budget");
}

}  // namespace
}  // namespace metrale
