// libFuzzer target for PEFT adapter configs: any bytes as adapter_config.json, beside the real
// adapter_model.safetensors of tests/data/fixtures/lora/qwen3_dense/a, checked against that
// fixture's model (qwen3, hidden 64, 3 layers), must yield an adapter or a metrale::Error, never
// a crash, hang or other exception. Seed with the fixtures' adapter_config.json files
// (fuzz/corpus/peft_adapter_fuzz). The fixture is found under the source tree (fuzz_source.h).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "fuzz_source.h"
#include "lora/peft_adapter.h"

namespace {

namespace fs = std::filesystem;

// The modules LoRA may adapt in tests/data/fixtures/qwen3_f32.
metrale::LoraModelInfo fixture_model() {
  metrale::LoraModelInfo m{
      .model_type = "qwen3", .hidden = 64, .vocab = 392, .tied_embeddings = true};
  const struct {
    const char* name;
    int64_t in, out;
  } proj[] = {{"self_attn.q_proj", 64, 128}, {"self_attn.k_proj", 64, 64},
              {"self_attn.v_proj", 64, 64},  {"self_attn.o_proj", 128, 64},
              {"mlp.gate_proj", 64, 160},    {"mlp.up_proj", 64, 160},
              {"mlp.down_proj", 160, 64}};
  for (int l = 0; l < 3; ++l) {
    for (const auto& p : proj) {
      m.modules.push_back({.name = "model.layers." + std::to_string(l) + "." + p.name,
                           .n_in = p.in,
                           .n_out = p.out});
    }
  }
  m.modules.push_back({.name = "lm_head", .n_in = 64, .n_out = 392});
  return m;
}

fs::path scratch() {
  static const fs::path dir = [] {
    const fs::path d = metrale::fuzz::scratch_dir("metrale-fuzz-peft_adapter_fuzz");
    fs::copy_file(metrale::fuzz::source_path(
                      "tests/data/fixtures/lora/qwen3_dense/a/adapter_model.safetensors"),
                  d / "adapter_model.safetensors", fs::copy_options::overwrite_existing);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const metrale::LoraModelInfo model = fixture_model();
  const fs::path dir = scratch();
  {
    std::ofstream out(dir / "adapter_config.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    (void)metrale::peft_max_rank(dir);
    const metrale::PeftAdapter a = metrale::load_peft_adapter(dir, "fuzz", model);
    (void)metrale::audit_report(a, model);
  } catch (const metrale::Error&) {
  }
  return 0;
}
