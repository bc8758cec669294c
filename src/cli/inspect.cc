// `metrale inspect DIR`: what a checkpoint is, without running it — config summary, layer
// kinds, the per-type predicates, and its tensors (layers folded: `model.layers.*.x` once
// with the count), parameter count and bytes; the tensors recognised but not loaded (a
// vision tower, MTP layers). With --max-batch N, a hybrid model's recurrent-state pool as
// the engine would reserve it (engine/state_pool.h): the block layout and the ring depth the
// budget allows.
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <string_view>

#include "cli/command.h"
#include "core/error.h"
#include "engine/model.h"
#include "engine/state_pool.h"
#include "io/config/model_config.h"
#include "io/safetensors/checkpoint.h"
#include "quant/quant_config.h"

namespace metrale::cli {
namespace {

struct Group {
  std::string shape_dtype;  // of the first member; "varies" when members differ
  int64_t count = 0;
};

struct InspectFlags {
  std::string dir;
  int64_t max_batch = 0;  // 0: not given
  std::string budget;     // empty: none
  std::string state_dtype = "f32";
  int64_t snapshots = 0;
  bool circuit = false;
  int threads = 0;
  int64_t max_rows = 16;
  std::string fusion = "none";
};

// The recurrent-state request the flags describe, validated before anything is read.
struct StateFlags {
  int64_t max_seqs = 0;
  std::optional<uint64_t> budget;
  DType dtype = DType::kF32;
  int64_t snapshots = 0;
};

void print_state_reserve(const ModelConfig& config, const StateFlags& s) {
  std::printf("\n");
  if (!config.has_linear_attention()) {
    std::printf(
        "recurrent state: none (%s has no linear-attention layers; the KV cache is all "
        "the per-sequence state)\n",
        config.model_type.c_str());
    return;
  }
  const std::vector<LayerStateShape> shapes = linear_state_shapes(config);
  const StateLayout layout = layout_states(shapes, s.dtype);
  const StateReservePlan plan = plan_state_reserve({.max_seqs = s.max_seqs,
                                                    .block_bytes = layout.block_bytes,
                                                    .snapshot_slots = s.snapshots,
                                                    .budget = s.budget});
  std::printf("%s", describe(plan, layout).c_str());
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// DeepSeek-V3 / GLM-4.5 keep their multi-token-prediction layers after the decoder layers.
bool is_mtp_layer_tensor(const ModelConfig& config, std::string_view name) {
  for (int64_t i = 0; i < config.n_mtp_layers; ++i) {
    if (starts_with(name, "model.layers." + std::to_string(config.n_layers + i) + ".")) return true;
  }
  return false;
}

bool has_mtp_layer_tensors(const ModelConfig& config, const Checkpoint& checkpoint) {
  for (const CheckpointTensor& t : checkpoint.tensors())
    if (is_mtp_layer_tensor(config, t.name())) return true;
  return false;
}

// KV cache bytes per token (f32 storage), per layer and in all, beside the uncompressed layout
// (per-head expanded keys and values; they differ for multi-head latent attention only).
void print_kv_bytes(const ModelConfig& config) {
  const std::vector<KvShape> kv = kv_shapes(config), full = uncompressed_kv_shapes(config);
  int64_t total = 0, total_full = 0;
  std::map<std::pair<int64_t, int64_t>, int64_t> kinds;  // (bytes, uncompressed) -> layers
  for (size_t i = 0; i < kv.size(); ++i) {
    total += kv[i].bytes_per_token();
    total_full += full[i].bytes_per_token();
    ++kinds[{kv[i].bytes_per_token(), full[i].bytes_per_token()}];
  }
  std::printf("kv cache per token (f32): %lld bytes over %zu layers", static_cast<long long>(total),
              kv.size());
  if (config.is_mla()) {
    std::printf(" (uncompressed: %lld, %.1fx)", static_cast<long long>(total_full),
                total > 0 ? static_cast<double>(total_full) / static_cast<double>(total) : 0.0);
  }
  std::printf("; f16 / bf16 (--kv-dtype): %lld bytes\n", static_cast<long long>(total / 2));
  for (const auto& [bytes, n] : kinds) {
    std::printf("  %lld layer(s): %lld bytes per token per layer", static_cast<long long>(n),
                static_cast<long long>(bytes.first));
    if (bytes.first == 0) {
      std::printf(" (linear attention: no KV cache)");
    } else if (config.is_mla()) {
      std::printf(" (latent %lld + rope key %lld values; uncompressed K+V %lld bytes)",
                  static_cast<long long>(config.mla.kv_lora_rank),
                  static_cast<long long>(config.mla.qk_rope_head_dim),
                  static_cast<long long>(bytes.second));
    }
    std::printf("\n");
  }
}

// Quantized checkpoints: the declared method, then every linear module's format as loaded
// and the rule that decided it (a config group, an ignore entry, or the tensors). Loading is
// the only way to say it truthfully (the tensors are checked against the config), so this
// loads the weights once, on one thread.
void print_quantization(const std::string& dir, const ModelConfig& config,
                        const Checkpoint& checkpoint) {
  bool quantized_tensors = false;
  for (const CheckpointTensor& t : checkpoint.tensors()) {
    for (const char* leaf : {".weight_packed", ".weight_scale", ".weight_scale_inv"})
      quantized_tensors = quantized_tensors || t.name().ends_with(leaf);
  }
  const bool legacy = std::filesystem::exists(std::filesystem::path(dir) / "hf_quant_config.json");
  if (config.quantization_config_json.empty() && !quantized_tensors && !legacy) {
    std::printf("quantization as loaded: none (every linear is stored plain)\n");
    return;
  }
  LoadOptions o;
  o.n_threads = 1;
  o.kv_tokens = 16;
  o.max_seqs = 1;
  o.load_tokenizer = false;
  std::unique_ptr<Model> model;
  try {
    model = Model::load(dir, o);
  } catch (const Error& e) {
    // inspect describes checkpoints it cannot run too: say what was declared and why not.
    const std::string declared = QuantConfig::parse(config.quantization_config_json, dir).method();
    std::printf("quantization: %s declared; not loadable by this build: %s\n",
                declared.empty() ? "none" : declared.c_str(), e.what());
    return;
  }
  const std::string& method = model->quant_method();
  std::printf("quantization as loaded: %s\n",
              method.empty() ? "no config; detected from tensor names" : method.c_str());
  std::map<std::string, int64_t> formats;
  for (const TensorLoader::ModuleReport& r : model->linear_report()) ++formats[r.format];
  std::printf("linear modules: %zu\n", model->linear_report().size());
  for (const auto& [format, n] : formats)
    std::printf("  %-64s x%lld\n", format.c_str(), static_cast<long long>(n));
  std::printf("per module:\n");
  for (const TensorLoader::ModuleReport& r : model->linear_report())
    std::printf("  %-44s %-40s [%s]\n", r.module.c_str(), r.format.c_str(), r.rule.c_str());
}

// The circuit's programs (circuit/program.h) as the model compiles them at load: per decode
// width, its instructions, how many each thread shares, the barriers per step beside the layer
// loop's dispatches, and the workspace; then width 1's instruction list ('|': a barrier first).
void print_circuit(const std::string& dir, int threads, int64_t max_rows,
                   const FusionPolicy& fusion) {
  LoadOptions o;
  o.n_threads = threads;
  o.kv_tokens = 64;
  o.max_seqs = 1;
  o.max_rows = max_rows;
  o.load_tokenizer = false;
  o.executor = ExecutorKind::kCircuit;
  o.fusion = fusion;
  const std::unique_ptr<Model> model = Model::load(dir, o);
  std::printf("\ncircuit (%d threads, fusion policy %s%s):\n", model->pool().size(),
              fusion_name(fusion).c_str(), fusion.any() ? "" : ": the layer loop's exact ops");
  if (model->programs().empty()) {
    std::printf("  no programs: the %s backend runs every step with the layer loop\n",
                std::string(model->backend().name()).c_str());
    return;
  }
  std::printf("  %6s %12s %6s %6s %6s %8s | %-21s | %16s %16s\n", "width", "instructions", "split",
              "serial", "pooled", "barriers", "linears only: split serial barriers",
              "layer dispatches", "workspace bytes");
  for (const auto& p : model->programs()) {
    const Program::Stats& s = p->stats();
    std::printf(
        "  %6lld %12lld %6lld %6lld %6lld %8lld |               %5lld %6lld %8lld | %16lld "
        "%16zu\n",
        static_cast<long long>(s.width), static_cast<long long>(s.instructions),
        static_cast<long long>(s.partitioned), static_cast<long long>(s.serial),
        static_cast<long long>(s.pooled), static_cast<long long>(s.barriers),
        static_cast<long long>(s.partitioned - s.split_ops),
        static_cast<long long>(s.serial + s.split_ops), static_cast<long long>(s.barriers_unsplit),
        static_cast<long long>(s.layer_dispatches), s.workspace_bytes);
  }
  const Program& first = *model->programs().front();
  const Program::Stats& f = first.stats();
  std::printf(
      "  linears only: the counts were rope, rms_norm, kv_store and attention run on one thread\n"
      "  other widths, prefill chunks, verify rows, LoRA rows and hidden-state readers: the "
      "layer loop\n");
  if (!fusion.any()) {
    std::printf("  fusions taken: none\n");
  } else {
    std::printf(
        "  fusions taken (width 1): residual add in the linear's epilogue x%lld, act(gate) * up "
        "in the gate|up epilogue x%lld, rms_norm in the next linear's input pass x%lld\n",
        static_cast<long long>(f.fused_residual), static_cast<long long>(f.fused_gate_up),
        static_cast<long long>(f.fused_norm));
    for (const std::string& note : first.fusion_notes())
      std::printf("  not fused, run as separate ops: %s\n", note.c_str());
  }
  std::printf("width 1's program ('|': a barrier before it):\n%s", first.describe().c_str());
}

void run_inspect(const std::string& dir, const std::optional<StateFlags>& state) {
  const ModelConfig config = load_model_config(dir);
  const Checkpoint checkpoint = Checkpoint::open(dir);
  std::printf("%s\n", describe(config).c_str());
  std::printf("ships_vanilla_norm_weights: %s\n",
              ships_vanilla_norm_weights(config) ? "true" : "false");
  std::printf("requires_single_chunk_prefill: %s\n",
              requires_single_chunk_prefill(config) ? "true" : "false");

  static const std::regex layer_index(R"(\.(\d+)\.)");
  std::map<std::string, Group> groups;
  int64_t params = 0;
  int64_t n_visual = 0, n_mtp = 0;
  for (const CheckpointTensor& t : checkpoint.tensors()) {
    params += t.info->shape.numel();
    if (starts_with(t.name(), "model.visual.")) ++n_visual;
    if (starts_with(t.name(), "mtp.") || is_mtp_layer_tensor(config, t.name())) ++n_mtp;
    const std::string key = std::regex_replace(std::string(t.name()), layer_index, ".*.",
                                               std::regex_constants::format_first_only);
    const std::string sd = std::string(dtype_name(t.info->dtype)) + t.info->shape.str();
    Group& g = groups[key];
    if (g.count == 0)
      g.shape_dtype = sd;
    else if (g.shape_dtype != sd)
      g.shape_dtype = "(shapes vary)";
    ++g.count;
  }
  std::printf("\ntensors: %zu in %zu file(s)\n", checkpoint.tensors().size(),
              checkpoint.files().size());
  for (const auto& [name, g] : groups) {
    if (g.count > 1)
      std::printf("  %-60s %-24s x%lld\n", name.c_str(), g.shape_dtype.c_str(),
                  static_cast<long long>(g.count));
    else
      std::printf("  %-60s %s\n", name.c_str(), g.shape_dtype.c_str());
  }
  std::printf("parameters: %lld (%.3f B)\nbytes: %llu (%.1f MB)\n", static_cast<long long>(params),
              static_cast<double>(params) / 1e9,
              static_cast<unsigned long long>(checkpoint.total_bytes()),
              static_cast<double>(checkpoint.total_bytes()) / 1e6);
  if (n_visual == 0 && !config.vision_config_json.empty()) {
    std::printf("vision tower: in config.json, no model.visual.* tensors in the checkpoint\n");
  } else if (n_visual > 0) {
    std::printf("vision tower: %lld %s (model.visual.*) recognised, not loaded\n",
                static_cast<long long>(n_visual), n_visual == 1 ? "tensor" : "tensors");
  }
  if (n_mtp > 0) {
    std::printf("MTP layers: %lld %s (%s) recognised, not loaded\n", static_cast<long long>(n_mtp),
                n_mtp == 1 ? "tensor" : "tensors",
                config.n_mtp_layers > 0 && has_mtp_layer_tensors(config, checkpoint)
                    ? "model.layers.<num_hidden_layers + i>.*"
                    : "mtp.*");
  }
  print_kv_bytes(config);
  for (const std::string& w : checkpoint.warnings()) std::printf("warning: %s\n", w.c_str());
  print_quantization(dir, config, checkpoint);
  if (state) print_state_reserve(config, *state);
}

// Checks the state flags (before any file is read) and says whether a plan was asked for.
std::optional<StateFlags> state_flags(const InspectFlags& f, bool has_max_batch,
                                      bool has_state_option) {
  if (!has_max_batch) {
    METRALE_CHECK(!has_state_option,
                  "--budget, --state-dtype and --snapshots size the recurrent-state pool: they "
                  "need --max-batch N");
    return std::nullopt;
  }
  StateFlags s;
  s.max_seqs = f.max_batch;
  if (!f.budget.empty()) s.budget = parse_byte_size(f.budget, "--budget");
  s.dtype = f.state_dtype == "f16" ? DType::kF16 : DType::kF32;
  s.snapshots = f.snapshots;
  return s;
}

void setup(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("inspect", "describe a checkpoint: config, layer kinds, tensors, sizes");
  auto f = std::make_shared<InspectFlags>();
  cmd->add_option("dir", f->dir, "checkpoint directory")->required();
  CLI::Option* max_batch =
      cmd->add_option("--max-batch", f->max_batch,
                      "size the recurrent-state pool of a hybrid model for N live sequences")
          ->check(CLI::Range(int64_t{1}, int64_t{std::numeric_limits<int32_t>::max() - 1}));
  CLI::Option* budget = cmd->add_option(
      "--budget", f->budget,
      "bytes the state pool may take: 4294967296, 512MiB, 2GiB, 1GB (default: no limit)");
  CLI::Option* dtype = cmd->add_option("--state-dtype", f->state_dtype, "state storage: f32, f16")
                           ->check(CLI::IsMember({"f32", "f16"}));
  CLI::Option* snapshots =
      cmd->add_option("--snapshots", f->snapshots, "state blocks kept for prefix caching")
          ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  cmd->add_flag("--circuit", f->circuit,
                "load the model and print its decode programs per batch width (ops, barriers, "
                "workspace)");
  cmd->add_option("--threads,-t", f->threads, "--circuit: threads the programs are split for")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--max-rows", f->max_rows, "--circuit: the widest program (default 16)")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  cmd->add_option("--fusion", f->fusion,
                  "--circuit: the fusion policy: none, default or a list of residual, gate_up, "
                  "norm (as generate / bench / serve take it)");
  cmd->callback([f, max_batch, budget, dtype, snapshots] {
    const FusionPolicy fusion = parse_fusion(f->fusion, "--fusion");  // before anything loads
    const std::optional<StateFlags> state = state_flags(
        *f, max_batch->count() > 0, budget->count() + dtype->count() + snapshots->count() > 0);
    run_inspect(f->dir, state);
    if (f->circuit) print_circuit(f->dir, f->threads, f->max_rows, fusion);
  });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
