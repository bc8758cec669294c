// `metrale tokenize --model DIR TEXT`: the token ids of TEXT, comma-separated on one line (the
// form `generate --ids` takes). `--decode` goes the other way: TEXT is comma-separated ids,
// printed as text. Only tokenizer.json (and tokenizer_config.json) are read, never weights.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "io/tokenizer/tokenizer.h"

namespace metrale::cli {
namespace {

struct TokenizeFlags {
  std::string dir;
  std::string text;
  bool decode = false;
  bool no_special = false;
  bool skip_special = false;
  bool json = false;
};

void run_tokenize(const TokenizeFlags& f) {
  const std::filesystem::path path = std::filesystem::path(f.dir) / "tokenizer.json";
  METRALE_CHECK(std::filesystem::exists(path), f.dir, ": no tokenizer.json");
  const Tokenizer tok = Tokenizer::from_file(path.string());
  if (f.decode) {
    // parse_id_list refuses what is not a list of integers >= 0; decode() names an id the
    // vocabulary lacks.
    const std::vector<int32_t> ids = parse_id_list(f.text, "TEXT (with --decode)");
    const std::string text = tok.decode(ids, f.skip_special);
    if (f.json) {
      std::printf("%s\n", nlohmann::json{{"text", text}}
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
    }
    return;
  }
  // Special tokens (bos) are added as `generate --prompt` adds them, so
  // `generate --ids "$(metrale tokenize ...)"` runs the same prompt.
  const std::vector<int32_t> ids = tok.encode(f.text, !f.no_special);
  if (f.json) {
    std::printf("%s\n", nlohmann::json{{"ids", ids}}.dump().c_str());
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
  std::printf("\n");
}

void setup(CLI::App& app) {
  auto f = std::make_shared<TokenizeFlags>();
  auto* cmd = app.add_subcommand(
      "tokenize",
      "print the token ids of a text (comma-separated), or with --decode the text of ids");
  cmd->add_option("--model,-m", f->dir, "checkpoint directory (its tokenizer.json)")->required();
  cmd->add_option("text", f->text, "the text; with --decode, comma-separated ids (1,2,3)")
      ->required();
  cmd->add_flag("--decode,-d", f->decode, "TEXT is ids: print their text");
  cmd->add_flag("--no-special", f->no_special, "do not add the tokenizer's special tokens (bos)");
  cmd->add_flag("--skip-special", f->skip_special, "with --decode: leave special tokens out");
  cmd->add_flag("--json", f->json, "print {\"ids\": [...]} (or {\"text\": ...} with --decode)");
  cmd->callback([f] { run_tokenize(*f); });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
