#pragma once
// A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), read and
// audited against the model it is meant for, the way PEFT 0.21 applies it:
//
//  - which modules it adapts: target_modules (a list: a module whose name equals an entry or
//    ends with "." + entry; a string: a regex the whole name must match), narrowed by
//    layers_to_transform / layers_pattern (list form only, as PEFT), minus exclude_modules and
//    modules_to_save; target_parameters for an MoE layer's fused experts;
//  - each module's rank and alpha: rank_pattern / alpha_pattern, the first key (in the file's
//    order) whose regex matches the end of the name after a dot, else r / lora_alpha; its
//    scale alpha / r, or alpha / sqrt(r) with use_rslora;
//  - the tensors: base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight [out, r];
//    for fused experts (PEFT's ParamWrapper) lora_A [r E, in] (expert e: rows [e r, e r + r))
//    and lora_B [out, r E] (expert e, rank j: column j E + e), the two parameters of one
//    experts module told apart by their shapes (gate_up [2 I, H], down [H, I]);
//  - token overlays: trainable_token_indices (new rows of embed_tokens, and of a tied lm_head)
//    and modules_to_save for embed_tokens / lm_head (whole tables).
//
// Everything is checked before anything is used: every key classified, pairs complete, shapes
// exactly as the config says, every target matched, values finite, modules the model lacks
// refused, each error naming the file and the key or field.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace metrale {

// What a model lets an adapter adapt (lora/lora_pool.h builds it from the model's blocks).
struct LoraModule {
  enum class Kind : uint8_t {
    kLinear,         // one projection: W [n_out, n_in]
    kExpertsGateUp,  // an MoE layer's experts' gate|up: [n_experts, n_out = 2 I, n_in = H]
    kExpertsDown,    // their down: [n_experts, n_out = H, n_in = I]
  };
  std::string name;  // the checkpoint's module path: "model.layers.0.self_attn.q_proj"
  Kind kind = Kind::kLinear;
  int64_t n_in = 0, n_out = 0;
  int64_t n_experts = 1;
};

struct LoraModelInfo {
  std::string model_type;
  int64_t hidden = 0, vocab = 0;
  bool tied_embeddings = false;
  std::vector<LoraModule> modules;
};

// One adapted module: A [rank, n_in] and B [n_out, rank] per expert (n_experts = 1 for a
// linear), as f32.
struct LoraPair {
  size_t module = 0;  // index into LoraModelInfo::modules
  int64_t rank = 0;
  float alpha = 0;
  float scale = 0;
  std::vector<float> a;  // [n_experts, rank, n_in]
  std::vector<float> b;  // [n_experts, n_out, rank]
  std::string a_key, b_key;
};

struct LoraTokenOverlay {
  std::vector<int32_t> ids;  // ascending, distinct
  std::vector<float> rows;   // [ids, hidden]: the rows that replace the table's
};

struct PeftAdapter {
  std::string name;
  std::filesystem::path dir;
  // adapter_config.json, as read.
  int64_t r = 0;
  double lora_alpha = 0;
  bool use_rslora = false;
  std::string base_model;  // base_model_name_or_path ("" when absent)
  std::vector<LoraPair> pairs;
  // trainable_token_indices on embed_tokens (applies to a tied lm_head too).
  LoraTokenOverlay tokens;
  // modules_to_save: whole replacement tables, [vocab, hidden] (empty: not saved).
  std::vector<float> embed_tokens;
  std::vector<float> lm_head;

  int64_t max_rank() const;
  // Bytes of the adapter's values as f32.
  uint64_t bytes() const;
};

// Reads and audits `dir` for `model`. Throws Error naming the file and key / field.
PeftAdapter load_peft_adapter(const std::filesystem::path& dir, const std::string& name,
                              const LoraModelInfo& model);

// The largest rank adapter_config.json declares (r and rank_pattern's values): what a pool
// needs to hold the adapter. Throws like load_peft_adapter on a bad config.
int64_t peft_max_rank(const std::filesystem::path& dir);

// The audit as text (`metrale lora audit`): the config as resolved, one line per adapted
// module (rank, alpha, scale, shapes), the overlays, and the totals.
std::string audit_report(const PeftAdapter& adapter, const LoraModelInfo& model);

}  // namespace metrale
