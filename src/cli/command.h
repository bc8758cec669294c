#pragma once
// Sub-commands register themselves: each src/cli/<name>.cc defines a setup function that adds
// its CLI11 sub-command, and a `METRALE_REGISTER_COMMAND(setup)` line. main.cc knows none of
// them by name, so adding a command touches one file.
#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace metrale::cli {

using CommandSetup = void (*)(CLI::App& app);

inline std::vector<CommandSetup>& command_registry() {
  static std::vector<CommandSetup> registry;
  return registry;
}

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSetup setup) { command_registry().push_back(setup); }
};

}  // namespace metrale::cli

#define METRALE_CONCAT_INNER(a, b) a##b
#define METRALE_CONCAT(a, b) METRALE_CONCAT_INNER(a, b)
#define METRALE_REGISTER_COMMAND(setup) \
  static ::metrale::cli::CommandRegistrar METRALE_CONCAT(metrale_cmd_, __LINE__)(setup)
