// `metrale`: the command-line tool. Sub-commands live one per file (see command.h).
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"metrale: run the layers of HuggingFace-format language models"};
  app.require_subcommand(1);
  for (auto setup : metrale::cli::command_registry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const metrale::Error& e) {
    std::fprintf(stderr, "metrale: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metrale: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
