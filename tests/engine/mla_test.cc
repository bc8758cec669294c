// The latent KV cache of multi-head latent attention: per token and layer only the normalised
// latent and the roped key (keys only, no V pages), sized from the config as `metrale inspect`
// reports it; a Gated DeltaNet layer keeps no KV at all. And DeepSeek-V3's FP8 layout with the
// untied bf16 head its release ships.
#include <gtest/gtest.h>

#include "checkpoint_copy.h"
#include "engine/model.h"
#include "fixture_util.h"

namespace metrale {
namespace {

std::unique_ptr<Model> load(const std::string& fixture) {
  LoadOptions o;
  o.n_threads = 1;
  o.kv_tokens = 64;
  return Model::load(testing::fixture_dir(fixture), o);
}

TEST(LatentCache, KeepsOnlyTheLatentAndTheRopeKey) {
  auto m = load("deepseek_v3_mtp_bf16");  // kv_lora_rank 24, qk_rope_head_dim 8, 3 layers
  for (int64_t i = 0; i < m->config().n_layers; ++i) {
    const KvLayerView v = m->kv_pool().layer(i);
    EXPECT_TRUE(v.layout.keys_only) << "layer " << i;
    EXPECT_EQ(v.v, nullptr) << "layer " << i;
    EXPECT_EQ(v.layout.n_kv_heads, 1);
    EXPECT_EQ(v.layout.head_dim, 24 + 8);
  }
  EXPECT_EQ(m->kv_pool().bytes_per_token(), 3 * (24 + 8) * 4);
  // Uncompressed: 4 heads x (expanded key nope 16 + rope 8, value 12) per layer.
  const std::vector<KvShape> full = uncompressed_kv_shapes(m->config());
  ASSERT_EQ(full.size(), 3u);
  EXPECT_EQ(full[0].bytes_per_token(), 4 * (16 + 8 + 12) * 4);
}

TEST(LatentCache, GqaKeepsKeysAndValuesAndLinearAttentionNothing) {
  auto glm = load("glm4_moe_qknorm_bf16");  // 2 kv heads x 32
  EXPECT_EQ(glm->kv_pool().bytes_per_token(), 2 * 2 * 2 * 32 * 4);
  EXPECT_FALSE(glm->kv_pool().layer(0).layout.keys_only);
  auto hybrid = load("qwen3_5_text_f32");  // layers 0-2 Gated DeltaNet, 3 attention 2 x 32
  EXPECT_EQ(hybrid->kv_pool().layer(0).k, nullptr);
  EXPECT_EQ(hybrid->kv_pool().bytes_per_token(), 2 * 2 * 32 * 4);
}

// DeepSeek-V3's FP8 config has no modules_to_not_convert and its lm_head is bf16: transformers
// keeps the output embedding unquantized by default, and so must the loader. The fixture is
// tied; an untied copy whose head equals the embedding gives the same logits.
TEST(DeepseekFp8, UntiedBf16HeadBesideFp8Linears) {
  testing::CheckpointCopy c("deepseek_v3_fp8");
  c.replace_in_config("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
  c.rewrite_all([](SafetensorsWriter& w, const SafetensorsFile& f) {
    for (const auto& t : f.tensors()) {
      w.add(t.name, t.dtype, t.shape, f.bytes(t));
      if (t.name == "model.embed_tokens.weight")
        w.add("lm_head.weight", t.dtype, t.shape, f.bytes(t));
    }
  });
  LoadOptions o;
  o.n_threads = 1;
  o.kv_tokens = 64;
  auto m = Model::load(c.dir(), o);
  EXPECT_FALSE(m->config().tie_word_embeddings);
  const testing::Reference ref("deepseek_v3_fp8");
  const std::vector<int32_t> ids = ref.ids("input_ids");
  std::vector<float> logits(ids.size() * static_cast<size_t>(m->vocab_size()));
  Sequence seq;
  m->prefill(seq, ids, logits, /*all_logits=*/true);
  m->release(seq);
  const std::vector<float> want = ref.floats("logits");
  ASSERT_EQ(want.size(), logits.size());
  EXPECT_LT(testing::max_abs_diff(want.data(), logits.data(), want.size()), 1e-4f);
}

}  // namespace
}  // namespace metrale
