// `metrale inspect`, run as the built binary (build/<dir>/src/metrale next to this test's
// build/<dir>/tests/): every committed fixture still inspects, the recurrent-state plan of
// --max-batch on a hybrid config, its flag errors, and the vision / MTP tensors it names.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "support/test_support.h"

namespace metrale {
namespace {

namespace fs = std::filesystem;

// Runs `metrale inspect <args>`.
CliRun inspect(const std::vector<std::string>& args) { return run_metrale("inspect", args); }

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A minimal safetensors file: one f32 [1] tensor per name.
void write_safetensors(const fs::path& path, const std::vector<std::string>& names) {
  std::string header = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    header += (i ? "," : "") + std::string("\"") + names[i] +
              "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(4 * i) +
              "," + std::to_string(4 * i + 4) + "]}";
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  unsigned char len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<unsigned char>(n >> (8 * b));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  const std::vector<char> data(4 * names.size(), 0);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// A checkpoint dir: a committed config (tests/data/configs/<type>) and a dummy weight file.
void make_checkpoint(const fs::path& dir, const std::string& config_type,
                     const std::vector<std::string>& tensors) {
  fs::copy_file("tests/data/configs/" + config_type + "/config.json", dir / "config.json");
  write_safetensors(dir / "model.safetensors", tensors);
}

TEST(Inspect, EveryFixtureStillInspects) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator("tests/data/fixtures")) {
    if (!fs::exists(entry.path() / "config.json")) continue;
    ++n;
    const CliRun r = inspect({entry.path().string()});
    EXPECT_EQ(0, r.status) << entry.path() << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "model_type: ")) << r.out;
    EXPECT_TRUE(has(r.out, "\ntensors: ")) << r.out;
    EXPECT_TRUE(has(r.out, "\nparameters: ")) << r.out;
    // Nothing about recurrent state without --max-batch.
    EXPECT_FALSE(has(r.out, "recurrent state")) << r.out;
    const bool hybrid = has(r.out, "linear_attention");
    const CliRun s = inspect({entry.path().string(), "--max-batch", "4"});
    EXPECT_EQ(0, s.status) << entry.path() << "\n" << s.out;
    EXPECT_TRUE(has(s.out, hybrid ? "\nslots: 5 (4 sequences + 1 padding dummy)\n"
                                  : "has no linear-attention layers"))
        << s.out;
  }
  EXPECT_GT(n, 0);
}

TEST(Inspect, QuantizedCheckpointPerModule) {
  const CliRun r = inspect({"tests/data/fixtures/quant_ct_mixed"});
  EXPECT_EQ(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "quantization as loaded: compressed-tensors\n")) << r.out;
  EXPECT_TRUE(has(r.out, "linear modules: 15\n")) << r.out;
  EXPECT_TRUE(has(r.out, "int4 group 128 asym (bf16 scales), compressed-tensors pack-quantized"))
      << r.out;
  EXPECT_TRUE(has(r.out, "int8 channel (bf16 scales)")) << r.out;
  // What the ignore list kept, and why.
  EXPECT_TRUE(has(r.out, "model.layers.0.mlp.down_proj")) << r.out;
  EXPECT_TRUE(has(r.out, "[quantization_config.ignore 'model.layers.0.mlp.down_proj']") ||
              has(r.out, "[ignore 'model.layers.0.mlp.down_proj']"))
      << r.out;
  const CliRun plain = inspect({"tests/data/fixtures/qwen3_bf16"});
  EXPECT_TRUE(has(plain.out, "quantization as loaded: none")) << plain.out;
}

TEST(Inspect, AttentionOnlyModelHasNoRecurrentState) {
  const CliRun r =
      inspect({"tests/data/fixtures/qwen3_f32", "--max-batch", "8", "--budget", "1GiB"});
  EXPECT_EQ(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out,
                  "\nrecurrent state: none (qwen3 has no linear-attention layers; the KV "
                  "cache is all the per-sequence state)\n"))
      << r.out;
}

TEST(Inspect, Qwen3NextStatePlan) {
  test::ScratchDir dir;
  make_checkpoint(dir.path(), "qwen3_next", {"model.embed_tokens.weight"});
  // 9 slots, 79036416-byte blocks (36 layers x (98304 + 2097152)): 4 GiB holds depth 4
  // (45 blocks = 3556638720 bytes), not 8 (81 blocks).
  CliRun r = inspect({dir.path().string(), "--max-batch", "8", "--budget", "4GiB"});
  EXPECT_EQ(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "recurrent state: f32, 36 of 48 layers (0-2,4-6,")) << r.out;
  EXPECT_TRUE(has(r.out, "  per layer: conv 98304 + ssm 2097152 bytes\n")) << r.out;
  EXPECT_TRUE(has(r.out, "79036416 bytes (75.4 MiB)")) << r.out;
  EXPECT_TRUE(has(r.out, "slots: 9 (8 sequences + 1 padding dummy)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "ring depth: 4 (5 versions per slot")) << r.out;
  EXPECT_TRUE(has(r.out, "  budget: 4294967296 bytes (4096.0 MiB)\n")) << r.out;
  EXPECT_TRUE(has(r.out, "  depth 8: 6401949696 bytes (6105.4 MiB), over budget\n")) << r.out;
  EXPECT_TRUE(has(r.out, "  depth 4: 3556638720 bytes (3391.9 MiB)  <- chosen\n")) << r.out;
  EXPECT_TRUE(has(r.out, "total: 3556638720 bytes (3391.9 MiB)\n")) << r.out;

  // f16 halves the block; snapshots add blocks; no budget takes depth 8.
  r = inspect(
      {dir.path().string(), "--max-batch", "1", "--state-dtype", "f16", "--snapshots", "4"});
  EXPECT_EQ(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "recurrent state: f16, 36 of 48 layers")) << r.out;
  EXPECT_TRUE(has(r.out, "  per layer: conv 49152 + ssm 1048576 bytes\n")) << r.out;
  EXPECT_TRUE(has(r.out, "  budget: none\n")) << r.out;
  EXPECT_TRUE(has(r.out, "snapshot slots: 4 (158072832 bytes")) << r.out;
  EXPECT_TRUE(has(r.out, "total: 869400576 bytes (829.1 MiB)\n")) << r.out;

  // Without --max-batch: nothing about the state.
  r = inspect({dir.path().string()});
  EXPECT_EQ(0, r.status) << r.out;
  EXPECT_FALSE(has(r.out, "recurrent state")) << r.out;
}

TEST(Inspect, StateFlagErrors) {
  test::ScratchDir dir;
  make_checkpoint(dir.path(), "qwen3_next", {"model.embed_tokens.weight"});
  const std::string d = dir.path().string();

  CliRun r = inspect({d, "--max-batch", "8", "--budget", "lots"});
  EXPECT_EQ(1, r.status) << r.out;
  EXPECT_TRUE(has(r.out,
                  "--budget: expected a byte count such as 1073741824, 512MiB, 2GiB or "
                  "1GB, found \"lots\""))
      << r.out;

  r = inspect({d, "--max-batch", "8", "--budget", "100MiB"});
  EXPECT_EQ(1, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "exceed the budget of 104857600 bytes (100.0 MiB)")) << r.out;

  r = inspect({d, "--budget", "1GiB"});
  EXPECT_EQ(1, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "need --max-batch N")) << r.out;

  r = inspect({d, "--max-batch", "0"});
  EXPECT_NE(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "--max-batch")) << r.out;

  r = inspect({d, "--max-batch", "2", "--state-dtype", "bf16"});
  EXPECT_NE(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "--state-dtype")) << r.out;

  r = inspect({d, "--max-batch", "2", "--snapshots", "-1"});
  EXPECT_NE(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "--snapshots")) << r.out;
}

TEST(Inspect, VisionAndMtpTensorsAreNamed) {
  test::ScratchDir dir;
  make_checkpoint(dir.path(), "qwen3_5",
                  {"model.language_model.embed_tokens.weight", "model.visual.patch_embed.weight",
                   "model.visual.blocks.0.attn.qkv.weight", "model.visual.merger.fc.weight",
                   "mtp.fc.weight", "mtp.layers.0.input_layernorm.weight"});
  const CliRun r = inspect({dir.path().string()});
  EXPECT_EQ(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out, "\nvision tower: 3 tensors (model.visual.*) recognised, not loaded\n"))
      << r.out;
  EXPECT_TRUE(has(r.out, "\nMTP layers: 2 tensors (mtp.*) recognised, not loaded\n")) << r.out;

  // A text-only checkpoint says neither.
  const CliRun t = inspect({"tests/data/fixtures/qwen3_f32"});
  EXPECT_EQ(0, t.status) << t.out;
  EXPECT_FALSE(has(t.out, "vision tower: ")) << t.out;
  EXPECT_FALSE(has(t.out, "MTP layers: ")) << t.out;
}

// The KV bytes per token per layer: MLA's latent layout beside the uncompressed one, and the
// MTP layer a DeepSeek-V3 checkpoint appends named as recognised and not loaded.
TEST(Inspect, KvBytesPerTokenAndMtpLayers) {
  const CliRun r = inspect({"tests/data/fixtures/deepseek_v3_mtp_bf16"});
  EXPECT_EQ(0, r.status) << r.out;
  EXPECT_TRUE(has(r.out,
                  "\nMTP layers: 42 tensors (model.layers.<num_hidden_layers + i>.*) "
                  "recognised, not loaded\n"))
      << r.out;
  // 3 layers of (kv_lora_rank 24 + rope 8) f32 = 128 B; HF: 4 heads x (16 + 8 + 12) x 4 = 576.
  EXPECT_TRUE(has(r.out,
                  "\nkv cache per token (f32): 384 bytes over 3 layers (uncompressed: "
                  "1728, 4.5x); f16 / bf16 (--kv-dtype): 192 bytes\n"))
      << r.out;
  EXPECT_TRUE(has(r.out,
                  "  3 layer(s): 128 bytes per token per layer (latent 24 + rope key 8 "
                  "values; uncompressed K+V 576 bytes)\n"))
      << r.out;

  const CliRun g = inspect({"tests/data/fixtures/glm4_moe_qknorm_bf16"});  // GQA 2 kv x 32
  EXPECT_EQ(0, g.status) << g.out;
  EXPECT_TRUE(has(g.out,
                  "\nkv cache per token (f32): 1024 bytes over 2 layers; f16 / bf16 "
                  "(--kv-dtype): 512 bytes\n"))
      << g.out;
  EXPECT_TRUE(has(g.out, "  2 layer(s): 512 bytes per token per layer\n")) << g.out;
}

}  // namespace
}  // namespace metrale
