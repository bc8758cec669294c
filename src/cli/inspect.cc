// `metrale inspect DIR`: what a checkpoint is, without running it — config summary, layer
// kinds, the per-type predicates, and its tensors (layers folded: `model.layers.*.x` once
// with the count), parameter count and bytes.
#include <cstdio>
#include <map>
#include <regex>

#include "cli/command.h"
#include "io/config/model_config.h"
#include "io/safetensors/checkpoint.h"

namespace metrale::cli {
namespace {

struct Group {
  std::string shape_dtype;  // of the first member; "varies" when members differ
  int64_t count = 0;
};

void run_inspect(const std::string& dir) {
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
  for (const CheckpointTensor& t : checkpoint.tensors()) {
    params += t.info->shape.numel();
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
  for (const std::string& w : checkpoint.warnings()) std::printf("warning: %s\n", w.c_str());
}

void setup(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("inspect", "describe a checkpoint: config, layer kinds, tensors, sizes");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("dir", *dir, "checkpoint directory")->required();
  cmd->callback([dir] { run_inspect(*dir); });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
