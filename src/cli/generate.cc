// `metrale generate --model DIR --prompt TEXT`: streams the continuation to stdout, then
// prints prompt and decode speed on stderr. With --json, prints one JSON line instead of the
// text: the prompt ids, the generated ids, why it stopped (for comparing engines), and the
// speculative drafts fed and accepted. --speculative ngram decodes with drafts (the output is
// the same).
#include <cstdio>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "engine/session.h"

namespace metrale::cli {
namespace {

struct GenerateFlags {
  ModelFlags model;
  LoraFlags lora;
  SpeculativeFlags spec;
  std::string prompt;
  std::string ids;
  GenerateOptions gen;
  std::vector<std::string> stop;
  bool no_special = false;
  bool json = false;
};

void print_ids(const char* key, const std::vector<int32_t>& ids) {
  std::printf("\"%s\": [", key);
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? ", " : "", ids[i]);
  std::printf("]");
}

void run_generate(const GenerateFlags& f) {
  METRALE_CHECK(!(f.prompt.empty() && f.ids.empty()),
                "generate: give --prompt TEXT or --ids 1,2,3");
  METRALE_CHECK(f.prompt.empty() || f.ids.empty(), "generate: give only one of --prompt and --ids");
  f.spec.check();
  std::unique_ptr<Model> model = load_model(f.model);
  const std::string adapter = f.lora.apply(*model);
  std::vector<int32_t> prompt;
  if (!f.ids.empty()) {
    prompt = parse_id_list(f.ids, "--ids");
  } else {
    METRALE_CHECK(model->tokenizer() != nullptr, f.model.dir,
                  ": no tokenizer.json, so --prompt cannot be encoded; pass --ids");
    prompt = model->tokenizer()->encode(f.prompt, !f.no_special);
  }
  METRALE_CHECK(!prompt.empty(), "generate: the prompt encodes to no tokens");
  GenerateOptions o = f.gen;
  o.stop_strings = f.stop;
  o.speculation = f.spec.options(*model);
  Session session(*model, adapter);
  if (!f.prompt.empty() && !f.json) std::fputs(f.prompt.c_str(), stdout);
  const GenerateResult r = session.generate(prompt, o, [&f](std::string_view piece) {
    if (f.json) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (f.json) {
    std::printf("{");
    print_ids("prompt_ids", prompt);
    std::printf(", ");
    print_ids("ids", r.tokens);
    std::printf(", \"stop\": \"%s\", \"drafted\": %lld, \"accepted\": %lld}",
                std::string(stop_reason_name(r.stop)).c_str(),
                static_cast<long long>(r.speculation.drafted),
                static_cast<long long>(r.speculation.accepted));
  } else if (model->tokenizer() == nullptr) {
    for (int32_t t : r.tokens) std::printf("%d ", t);
  }
  std::printf("\n");
  std::fflush(stdout);  // the text before the statistics, also when both go to a terminal
  const auto n_dec = static_cast<double>(r.tokens.size());
  std::fprintf(
      stderr,
      "prompt: %lld tokens, %.1f tokens/s | decode: %lld tokens, %.1f tokens/s | stop: %s\n",
      static_cast<long long>(r.prompt_tokens),
      r.prefill_seconds > 0 ? static_cast<double>(r.prompt_tokens) / r.prefill_seconds : 0.0,
      static_cast<long long>(r.tokens.size()),
      r.decode_seconds > 0 && n_dec > 1 ? (n_dec - 1) / r.decode_seconds : 0.0,
      std::string(stop_reason_name(r.stop)).c_str());
  if (f.spec.on()) {
    const SpeculationCounts& c = r.speculation;
    std::fprintf(
        stderr,
        "speculative (%s): %lld verify steps, %lld drafted, %lld accepted (%.1f%%), "
        "%.2f accepted per verify step\n",
        f.spec.kind.c_str(), static_cast<long long>(c.verify_steps),
        static_cast<long long>(c.drafted), static_cast<long long>(c.accepted),
        c.drafted > 0 ? 100.0 * static_cast<double>(c.accepted) / static_cast<double>(c.drafted)
                      : 0.0,
        c.verify_steps > 0 ? static_cast<double>(c.accepted) / static_cast<double>(c.verify_steps)
                           : 0.0);
  }
}

void setup(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt");
  f->model.add_to(*cmd);
  f->lora.add_to(*cmd);
  f->spec.add_to(*cmd);
  cmd->add_option("--prompt,-p", f->prompt, "prompt text (encoded with the model's tokenizer)");
  cmd->add_option("--ids", f->ids, "prompt as comma-separated token ids instead of text");
  cmd->add_flag("--no-special", f->no_special, "do not add the tokenizer's special tokens (bos)");
  cmd->add_option("--max-tokens,-n", f->gen.max_new_tokens, "most tokens to generate")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--temperature", f->gen.sampling.temperature, "0 = greedy")
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", f->gen.sampling.top_k, "0 = off")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--top-p", f->gen.sampling.top_p, "in (0, 1]; 1 = off")
      ->check(CLI::Range(1e-6f, 1.0f));
  cmd->add_option("--min-p", f->gen.sampling.min_p, "0 = off")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--repetition-penalty", f->gen.sampling.repetition_penalty, "1 = off")
      ->check(CLI::Range(0.01f, 100.0f));
  cmd->add_option("--seed", f->gen.seed, "sampling seed");
  cmd->add_option("--stop", f->stop, "stop when the text contains this (repeatable)");
  cmd->add_flag("--ignore-eos", f->gen.ignore_eos, "keep generating past eos tokens");
  cmd->add_flag("--json", f->json,
                "print one JSON line {prompt_ids, ids, stop, drafted, accepted} instead of the "
                "text");
  cmd->callback([f] { run_generate(*f); });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
