// Bad input to the MTP drafter: checkpoints without (or with broken) MTP layers, and calls that
// would leave the drafter's rows inconsistent. Each is an Error naming what is wrong.
#include <gtest/gtest.h>

#include "checkpoint_copy.h"
#include "mtp_fixture.h"
#include "support/test_support.h"

namespace metrale {
namespace {

using testing::CheckpointCopy;
using testing::expect_has;
using testing::MtpPair;
using testing::rows_at;

std::string drafter_error(const std::filesystem::path& dir) {
  return test::error_of([&] {
    auto m = Model::load(dir, testing::small_load_options());
    MtpProposer::load(*m);
  });
}

TEST(MtpBadInput, ModelsWithoutMtpLayers) {
  // deepseek_v3_noqlora: num_nextn_predict_layers 0.
  std::string msg = drafter_error(testing::fixture_dir("deepseek_v3_noqlora_bf16"));
  expect_has(msg, "num_nextn_predict_layers: 0");
  expect_has(msg, "deepseek_v3_noqlora_bf16");
  // A family without MTP layers.
  msg = drafter_error(testing::fixture_dir("qwen3_f32"));
  expect_has(msg, "model_type 'qwen3' has no MTP drafter");
  // glm4_moe_plain declares one MTP layer and ships none (a checkpoint with it stripped).
  msg = drafter_error(testing::fixture_dir("glm4_moe_plain_bf16"));
  expect_has(msg, "model.layers.2.enorm.weight");
  // A Qwen3-Next checkpoint without its mtp.* tensors.
  msg = drafter_error(testing::fixture_dir("qwen3_next_f32"));
  expect_has(msg, "mtp.pre_fc_norm_embedding.weight");
}

TEST(MtpBadInput, MissingMisshapenAndStrayMtpTensors) {
  {
    CheckpointCopy c("deepseek_v3_mtp_bf16");
    c.rewrite([](const std::string& n) { return n != "model.layers.3.self_attn.o_proj.weight"; });
    expect_has(drafter_error(c.dir()), "model.layers.3.self_attn.o_proj.weight");
  }
  {
    CheckpointCopy c("deepseek_v3_mtp_bf16");
    c.rewrite_all([](SafetensorsWriter& w, const SafetensorsFile& f) {
      for (const auto& t : f.tensors()) {
        if (t.name == "model.layers.3.eh_proj.weight") {  // [64, 128] cut to [64, 64]
          w.add(t.name, t.dtype, Shape{64, 64}, f.bytes(t).first(64 * 64 * 2));
        } else {
          w.add(t.name, t.dtype, t.shape, f.bytes(t));
        }
      }
    });
    const std::string msg = drafter_error(c.dir());
    expect_has(msg, "model.layers.3.eh_proj.weight");
    expect_has(msg, "128");
  }
  {
    CheckpointCopy c("glm4_moe_qknorm_bf16");
    c.rewrite_all([](SafetensorsWriter& w, const SafetensorsFile& f) {
      for (const auto& t : f.tensors()) w.add(t.name, t.dtype, t.shape, f.bytes(t));
      const float x[2] = {1, 2};
      w.add("model.layers.2.mlp.extra.weight", DType::kF32, Shape{2},
            {reinterpret_cast<const std::byte*>(x), sizeof(x)});
    });
    expect_has(drafter_error(c.dir()), "'model.layers.2.mlp.extra.weight'");
  }
}

TEST(MtpBadInput, RowsTheDrafterDoesNotHold) {
  MtpPair pair("glm4_moe_qknorm_bf16");
  const testing::MtpReference ref("glm4_moe_qknorm_bf16");
  const std::vector<int32_t> ids = ref.ids("ids");
  const std::vector<float> hidden = ref.floats("target_hidden");
  const int64_t H = 64, P = 20;
  MtpProposer& d = *pair.drafter;
  auto s = d.alloc_state();
  d.prefill_drafter(*s, std::span(ids).first(P), rows_at(hidden, 0, P, H));
  std::vector<int32_t> drafts;
  const speculative::ProposeArgs first{.state = s.get(),
                                       .last = ids[P],
                                       .hidden = rows_at(hidden, P - 1, 1, H),
                                       .position = P,
                                       .n = 3};
  d.propose(first, drafts);
  d.after_verify(*s, 2);
  // The accepted drafts' rows were not caught up: the next propose cannot draft from them.
  std::string msg = test::error_of([&] {
    d.propose({.state = s.get(),
               .last = ids[P + 3],
               .hidden = rows_at(hidden, P + 2, 1, H),
               .position = P + 3,
               .n = 1},
              drafts);
  });
  expect_has(msg, "keys 20..21");
  // Nor can catchup skip keys.
  msg = test::error_of([&] {
    d.catchup(*s, {.first_key = P + 1,
                   .ids = std::span(ids).subspan(P + 2, 1),
                   .hidden = rows_at(hidden, P + 1, 1, H)});
  });
  expect_has(msg, "leaves keys 20..20 without drafter rows");
  // A token outside the vocabulary.
  msg = test::error_of([&] {
    d.propose({.state = s.get(),
               .last = 392,
               .hidden = rows_at(hidden, P, 1, H),
               .position = P + 1,
               .n = 1},
              drafts);
  });
  expect_has(msg, "token id 392 is outside the vocabulary");
  // After all that, the drafter still drafts from where it is.
  d.propose({.state = s.get(),
             .last = ids[P + 1],
             .hidden = rows_at(hidden, P, 1, H),
             .position = P + 1,
             .n = 1},
            drafts);
  EXPECT_EQ(drafts.size(), 1u);
  d.free_state(*s);
}

}  // namespace
}  // namespace metrale
