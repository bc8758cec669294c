#include "models/registry.h"

#include <array>

#include "models/families.h"

namespace metrale {

std::span<const ArchitectureEntry> architectures() {
  static constexpr std::array<ArchitectureEntry, 18> kFamilies = {{
      {"llama", &build_dense_decoder},
      {"mistral", &build_dense_decoder},
      {"qwen2", &build_dense_decoder},
      {"qwen2_vl", &build_qwen2_vl},
      {"qwen2_5_vl", &build_qwen2_vl},
      {"qwen3", &build_dense_decoder},
      {"qwen3_moe", &build_qwen3_moe},
      {"qwen3_vl", &build_qwen2_vl},
      {"qwen3_vl_moe", &build_qwen2_vl},
      {"qwen3_next", &build_qwen3_next, &build_qwen3_next_mtp},
      {"qwen3_5", &build_qwen3_next},
      {"qwen3_5_text", &build_qwen3_next},
      {"qwen3_5_moe", &build_qwen3_next},
      {"qwen3_5_moe_text", &build_qwen3_next},
      {"deepseek_v3", &build_deepseek_v3, &build_deepseek_v3_mtp},
      {"glm4_moe", &build_glm4_moe, &build_glm4_moe_mtp},
      {"glm4v", &build_glm4v},
      {"glm4v_moe", &build_glm4v_moe},
  }};
  return kFamilies;
}

const ArchitectureEntry* find_architecture(std::string_view model_type) {
  for (const ArchitectureEntry& e : architectures()) {
    if (e.model_type == model_type) return &e;
  }
  return nullptr;
}

}  // namespace metrale
