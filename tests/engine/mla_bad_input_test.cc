// Bad DeepSeek-V3 / GLM-4.5 checkpoints: MLA widths, expert groups and the router's correction
// bias that contradict the tensors (or each other) get an error naming the field or tensor,
// expected vs found — at load, never a wrong answer.
#include <gtest/gtest.h>

#include "checkpoint_copy.h"
#include "core/error.h"
#include "engine/model.h"

namespace metrale {
namespace {

using testing::CheckpointCopy;
using testing::expect_has;
using testing::load_error;

constexpr const char* kMla = "deepseek_v3_mtp_bf16";  // q_lora 32, kv_lora 24, nope 16, rope 8

TEST(MlaBadInput, KvLoraRankContradictsTheTensors) {
  CheckpointCopy c(kMla);
  c.replace_in_config("\"kv_lora_rank\": 24", "\"kv_lora_rank\": 20");
  const std::string msg = load_error(c);
  expect_has(msg, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  expect_has(msg, "has shape [32, 64], expected [28, 64]");
}

TEST(MlaBadInput, RopeDimContradictsTheTensors) {
  CheckpointCopy c(kMla);
  c.replace_in_config("\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 4");
  const std::string msg = load_error(c);
  expect_has(msg, "model.layers.0.self_attn.q_b_proj.weight");
  expect_has(msg, "has shape [96, 32], expected [80, 32]");
}

TEST(MlaBadInput, HeadDimsContradictTheTensors) {
  {
    CheckpointCopy c(kMla);
    c.replace_in_config("\"v_head_dim\": 12", "\"v_head_dim\": 16");
    const std::string msg = load_error(c);
    expect_has(msg, "model.layers.0.self_attn.kv_b_proj.weight");
    expect_has(msg, "has shape [112, 24], expected [128, 24]");
  }
  {
    CheckpointCopy c(kMla);
    c.replace_in_config("\"qk_nope_head_dim\": 16", "\"qk_nope_head_dim\": 12");
    expect_has(load_error(c), "'model.layers.0.self_attn.q_b_proj.weight' has shape [96, 32]");
  }
}

TEST(MlaBadInput, QLoraRankContradictsTheTensors) {
  {
    CheckpointCopy c(kMla);
    c.replace_in_config("\"q_lora_rank\": 32", "\"q_lora_rank\": null");
    expect_has(load_error(c),
               "q_lora_rank is null but the checkpoint has "
               "'model.layers.0.self_attn.q_a_proj.weight'");
  }
  {
    CheckpointCopy c("deepseek_v3_noqlora_bf16");
    c.replace_in_config("\"q_lora_rank\": null", "\"q_lora_rank\": 16");
    expect_has(load_error(c),
               "but the checkpoint has a full-rank "
               "'model.layers.0.self_attn.q_proj.weight'");
  }
}

TEST(MlaBadInput, ExpertGroupsContradictTheExperts) {
  {
    CheckpointCopy c(kMla);  // 8 experts
    c.replace_in_config("\"n_group\": 2", "\"n_group\": 3");
    const std::string msg = load_error(c);
    expect_has(msg, "n_group");
    expect_has(msg, "expected a divisor of the expert count 8, found 3");
  }
  {
    CheckpointCopy c(kMla);
    c.replace_in_config("\"topk_group\": 1", "\"topk_group\": 3");
    const std::string msg = load_error(c);
    expect_has(msg, "topk_group");
    expect_has(msg, "expected at most n_group 2, found 3");
  }
  {
    CheckpointCopy c("glm4_moe_qknorm_bf16");
    c.replace_in_config("\"n_routed_experts\": 8", "\"n_routed_experts\": 6");
    expect_has(load_error(c),
               "'model.layers.1.mlp.gate.weight' has shape [8, 64], expected [6, 64]");
  }
}

TEST(MlaBadInput, CorrectionBiasOfTheWrongLength) {
  CheckpointCopy c(kMla);
  c.rewrite_all([](SafetensorsWriter& w, const SafetensorsFile& f) {
    for (const auto& t : f.tensors()) {
      if (t.name == "model.layers.2.mlp.gate.e_score_correction_bias") {
        w.add(t.name, t.dtype, Shape{6}, f.bytes(t).first(dtype_bytes(t.dtype, 6)));
      } else {
        w.add(t.name, t.dtype, t.shape, f.bytes(t));
      }
    }
  });
  expect_has(
      load_error(c),
      "tensor 'model.layers.2.mlp.gate.e_score_correction_bias' has shape [6], expected [8]");
}

TEST(MlaBadInput, MissingCorrectionBias) {
  CheckpointCopy c("glm4_moe_plain_bf16");
  c.rewrite([](const std::string& n) {
    return !n.ends_with("layers.1.mlp.gate.e_score_correction_bias");
  });
  expect_has(load_error(c), "missing tensor 'model.layers.1.mlp.gate.e_score_correction_bias'");
}

// The MTP layer after the decoder layers is skipped only as the config counts it: with
// num_nextn_predict_layers 0 its tensors are tensors nobody claimed.
TEST(MlaBadInput, MtpLayerTheConfigDoesNotCount) {
  CheckpointCopy c(kMla);
  c.replace_in_config("\"num_nextn_predict_layers\": 1", "\"num_nextn_predict_layers\": 0");
  expect_has(load_error(c), "model.layers.3.");
}

}  // namespace
}  // namespace metrale
