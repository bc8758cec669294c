// Qwen3-MoE beyond parity (which model_parity_test covers): both tensor layouts load to the
// same model, the architecture is composed as the config says, and a config that contradicts
// the checkpoint's experts fails at load naming the field or tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "checkpoint_copy.h"
#include "core/error.h"
#include "engine/model.h"
#include "fixture_util.h"
#include "layers/ffn.h"

namespace metrale {
namespace {

using test::error_of;
using testing::CheckpointCopy;
using testing::Reference;

LoadOptions options() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 256;
  return o;
}

std::vector<float> prompt_logits(Model& m, const std::vector<int32_t>& ids) {
  std::vector<float> logits(ids.size() * static_cast<size_t>(m.vocab_size()));
  Sequence s;
  m.prefill(s, ids, logits, /*all_logits=*/true);
  m.release(s);
  return logits;
}

TEST(Qwen3Moe, LayersAreComposedAsTheConfigSays) {
  // qwen3_moe_f32: mlp_only_layers [1]; qwen3_moe_nonorm: decoder_sparse_step 2 of 4 layers.
  for (const auto& [name, sparse] : std::vector<std::pair<std::string, std::vector<bool>>>{
           {"qwen3_moe_f32", {true, false, true}},
           {"qwen3_moe_nonorm_f32", {false, true, false, true}}}) {
    auto m = Model::load(testing::fixture_dir(name), options());
    const Architecture& a = m->architecture();
    ASSERT_EQ(a.layers.size(), sparse.size()) << name;
    for (size_t i = 0; i < sparse.size(); ++i) {
      const auto* moe = dynamic_cast<const MoeFfn*>(&a.layers[i].ffn());
      EXPECT_EQ(moe != nullptr, sparse[i])
          << name << " layer " << i << ": " << a.layers[i].ffn().describe();
      if (moe != nullptr) {
        EXPECT_EQ(moe->n_experts(), m->config().moe.n_experts);
        EXPECT_EQ(moe->top_k(), 2);
      }
    }
    // A decoded token reads the router and top-k experts, not every expert.
    EXPECT_LT(m->active_weight_bytes(), m->weight_bytes()) << name;
  }
}

// transformers 5 keeps each layer's experts as two stacked parameters, gate_up_proj
// [E, 2I, H] and down_proj [E, H, I]; a checkpoint written that way gives the same model.
TEST(Qwen3Moe, StackedExpertLayoutLoadsToTheSameModel) {
  const std::string name = "qwen3_moe_nonorm_f32";
  const Reference ref(name);
  auto per_expert = Model::load(testing::fixture_dir(name), options());
  const ModelConfig& c = per_expert->config();
  CheckpointCopy copy(name);
  copy.rewrite_all([&](SafetensorsWriter& w, const SafetensorsFile& f) {
    for (const auto& t : f.tensors()) {
      if (t.name.find(".mlp.experts.") == std::string::npos)
        w.add(t.name, t.dtype, t.shape, f.bytes(t));
    }
  });
  // The experts, stacked, in a second file (a folder of *.safetensors without an index).
  std::filesystem::rename(copy.dir() / "model.safetensors", copy.dir() / "rest.safetensors");
  std::filesystem::remove(copy.dir() / "reference.safetensors");
  SafetensorsWriter experts;
  const Checkpoint orig = Checkpoint::open(testing::fixture_dir(name));
  const int64_t E = c.moe.n_experts, I = c.moe.moe_intermediate_size, H = c.hidden_size;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    std::vector<std::byte> gate_up, down;
    for (int64_t e = 0; e < E; ++e) {
      for (const char* part : {"gate_proj", "up_proj", "down_proj"}) {
        const auto bytes = orig.at(p + std::to_string(e) + "." + part + ".weight").bytes();
        auto& dst = std::string(part) == "down_proj" ? down : gate_up;
        dst.insert(dst.end(), bytes.begin(), bytes.end());
      }
    }
    experts.add(p + "gate_up_proj", DType::kF32, Shape{E, 2 * I, H}, gate_up);
    experts.add(p + "down_proj", DType::kF32, Shape{E, H, I}, down);
  }
  experts.write(copy.dir() / "experts.safetensors");
  auto stacked = Model::load(copy.dir(), options());
  const std::vector<int32_t> ids = ref.ids("input_ids");
  EXPECT_EQ(prompt_logits(*stacked, ids), prompt_logits(*per_expert, ids));
}

TEST(Qwen3Moe, ConfigThatContradictsTheExpertsIsRefused) {
  const std::string name = "qwen3_moe_f32";
  {
    CheckpointCopy copy(name);  // one expert fewer than the checkpoint holds
    copy.replace_in_config("\"num_local_experts\": 8", "\"num_local_experts\": 7");
    const std::string msg = error_of([&] { Model::load(copy.dir(), options()); });
    EXPECT_NE(msg.find("mlp.gate.weight"), std::string::npos) << msg;
  }
  {
    CheckpointCopy copy(name);  // an expert missing
    copy.rewrite([](const std::string& n) {
      return n.find("layers.2.mlp.experts.5.up_proj") == std::string::npos;
    });
    const std::string msg = error_of([&] { Model::load(copy.dir(), options()); });
    EXPECT_NE(msg.find("missing tensor 'model.layers.2.mlp.experts.5.up_proj.weight'"),
              std::string::npos)
        << msg;
  }
  {
    CheckpointCopy copy(name);  // expert width disagrees with the tensors
    copy.replace_in_config("\"moe_intermediate_size\": 48", "\"moe_intermediate_size\": 40");
    const std::string msg = error_of([&] { Model::load(copy.dir(), options()); });
    EXPECT_NE(msg.find("experts.0.gate_proj.weight' has shape [48, 64], expected [40, 64]"),
              std::string::npos)
        << msg;
  }
  {
    CheckpointCopy copy(name);  // the sparse step says layer 0 is dense, the tensors say MoE
    copy.replace_in_config("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 3");
    const std::string msg = error_of([&] { Model::load(copy.dir(), options()); });
    EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
  }
  {
    CheckpointCopy copy(name);  // top-k larger than the expert count
    copy.replace_in_config("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9");
    const std::string msg = error_of([&] { Model::load(copy.dir(), options()); });
    EXPECT_NE(msg.find("num_experts_per_tok"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace metrale
