// libFuzzer target for config.json parsing: any bytes must yield a ModelConfig (and, for a
// vision-language type, a VisionConfig) or a metrale::Error, never a crash, hang or other
// exception. Seed with tests/data/configs/*/ and tests/data/fixtures/qwen2_vl_f32/.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "io/config/model_config.h"
#include "io/config/vision_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    metrale::ModelConfig config = metrale::parse_model_config(text, "fuzz/config.json");
    (void)metrale::describe(config);
    (void)metrale::requires_single_chunk_prefill(config);
  } catch (const metrale::Error&) {
  }
  try {
    (void)metrale::parse_vision_config(text, "fuzz/config.json");
  } catch (const metrale::Error&) {
  }
  return 0;
}
