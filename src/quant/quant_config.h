#pragma once
// The quantization a checkpoint declares, per linear module. Three dialects are read:
//
//  - compressed-tensors (config.json quantization_config.quant_method "compressed-tensors",
//    written by llm-compressor): config_groups, each with `targets` and a `weights` scheme
//    (num_bits, type int|float, strategy tensor|channel|group|block|tensor_group, group_size,
//    symmetric, actorder) and a `format`; `ignore` keeps modules unquantized. Targets and
//    ignore entries are exact module names, "re:" regexes matched from the start of the name
//    (Python's re.match), or the class name "Linear". A module takes the first target that
//    matches in compressed-tensors' order over all groups (plain names before regexes, each
//    sorted), and an ignore entry beats every target.
//  - ModelOpt (quant_method "modelopt" in config.json, or the legacy hf_quant_config.json
//    {"quantization": {...}}): quant_algo FP8 / FP8_PER_CHANNEL_PER_TOKEN / FP8_PB_WO / NVFP4
//    and exclude_modules, fnmatch globs ("*" crosses dots, so "model.layers.1.mlp*" covers
//    the subtree).
//  - fp8 block-scaled (quant_method "fp8", DeepSeek-V3 / Qwen3-*-FP8 / transformers'
//    FineGrainedFP8Config): weight_block_size, and modules_to_not_convert as transformers
//    reads them (should_convert_module): a regex from the start of the name up to a module
//    boundary ("model.layers.1" covers the subtree, not layer 11), or a suffix ("lm_head").
//
// A declared config wins; without one, tensor names decide per module (weights/
// quant_tensors.h). Either way the tensors are checked against the scheme at load, and a
// malformed entry or an unknown method refuses the load with the field's name.
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace metrale {

enum class QuantDialect : uint8_t { kNone, kCompressedTensors, kModelOpt, kFp8Block };
std::string_view quant_dialect_name(QuantDialect d);

// What the config says about one linear module's weight.
struct ModuleScheme {
  enum class Kind : uint8_t {
    kUnquantized,  // stored plain (f32 / bf16)
    kAny,          // quantized in some layout the tensors tell (no config: detection)
    kInt,          // integers with scales (compressed-tensors pack-quantized)
    kFloat8,       // float8_e4m3fn with scales
    kNvfp4,        // e2m1 with e4m3 group scales and a global scale
  };
  Kind kind = Kind::kUnquantized;
  int bits = 0;                // 4 or 8 for kInt
  int64_t group_size = 0;      // strategy "group" / nvfp4; 0 when not stated
  std::string strategy;        // as declared ("channel", "group", "tensor", "block"), or ""
  bool symmetric = true;       // kInt: false -> zero points
  bool actorder = false;       // kInt: a g_idx is expected (actorder "group")
  std::vector<int64_t> block;  // [rows, cols] of a block strategy / weight_block_size
  std::string rule;            // why: "config_groups.group_0 target 'Linear'", "ignore 'lm_head'"
};
std::string_view module_kind_name(ModuleScheme::Kind k);

class QuantConfig {
 public:
  // No quantization declared: tensor names decide per module.
  QuantConfig();
  ~QuantConfig();
  QuantConfig(QuantConfig&&) noexcept;
  QuantConfig& operator=(QuantConfig&&) noexcept;

  // `quantization_json`: config.json's quantization_config as JSON text ("" when absent);
  // `dir`: the checkpoint directory (for a legacy hf_quant_config.json). Errors name the file
  // and field.
  static QuantConfig parse(std::string_view quantization_json, const std::filesystem::path& dir);

  QuantDialect dialect() const;
  // "compressed-tensors", "modelopt", "fp8", or "" (none declared).
  const std::string& method() const;
  // Where the config came from ("config.json quantization_config", "hf_quant_config.json").
  const std::string& source() const;
  // The scheme of the linear module `module` ("model.layers.0.self_attn.q_proj").
  ModuleScheme scheme_for(std::string_view module) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Shell-style glob as Python's fnmatch.fnmatchcase: "*" any run (dots included), "?" one
// character, "[seq]" / "[!seq]" a set; anything else literal.
bool fnmatch(std::string_view pattern, std::string_view name);

}  // namespace metrale
