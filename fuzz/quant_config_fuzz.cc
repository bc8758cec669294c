// libFuzzer target for quantization configs: any bytes as config.json's quantization_config
// must yield a QuantConfig (then a scheme per module) or a metrale::Error, never a crash,
// hang or other exception. Seed with the quantization_config of tests/data/fixtures/quant_*.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "quant/quant_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (text.empty()) return 0;  // "" means "no config" (then hf_quant_config.json is looked for)
  try {
    const metrale::QuantConfig c = metrale::QuantConfig::parse(text, "/nonexistent-fuzz-dir");
    for (const char* m : {"lm_head", "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.gate",
                          "model.layers.10.mlp.experts.3.down_proj", ""}) {
      (void)c.scheme_for(m);
    }
  } catch (const metrale::Error&) {
  }
  return 0;
}
