// `metrale embed --model DIR [--json] [--dimensions N] [--ids] [--input-file F] [--rounds N]
// TEXT...`: one embedding per TEXT and per line of F (after the TEXTs), pooled and normalised
// as the checkpoint's sentence-transformers files say (engine/embedding_config.h; without them
// last-token pooling + L2 normalisation). TEXTs are tokenized with the tokenizer's special
// tokens, as sentence-transformers encodes them; with --ids each TEXT is comma-separated token
// ids instead. All inputs share steps.
//
// Output: one line per input, its values separated by spaces (each printed exactly: %.9g
// reads back to the same f32); --json: one line {"pooling", "normalize", "dimensions",
// "data": [{"index", "tokens", "embedding"}]}. What the pipeline is goes to stderr.
//
// --rounds N times the embedding of all inputs N more times after the first (a warm-up, whose
// result is the one printed) and reports the median round: inputs/s and tokens/s on stderr,
// and under "timing" in --json. Tokenization is outside the clock (it is done once, before).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "engine/embedding.h"

namespace metrale::cli {
namespace {

struct EmbedFlags {
  ModelFlags model;
  std::vector<std::string> texts;
  std::string input_file;
  int64_t rounds = 0;
  int64_t dimensions = 0;
  bool ids = false;
  bool json = false;
};

// One input per line of `path` ("-": standard input), a final newline optional. An empty line
// is an error naming the file and line, not an input skipped (the outputs' indices would no
// longer be the lines').
std::vector<std::string> read_input_lines(const std::string& path) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    file.open(path, std::ios::binary);
    METRALE_CHECK(file.good(), "--input-file ", path, ": cannot be opened");
    in = &file;
  }
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(*in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    METRALE_CHECK(!line.empty(), "--input-file ", path, ": line ", lines.size() + 1,
                  " is empty (every line is one input)");
    lines.push_back(std::move(line));
  }
  METRALE_CHECK(!in->bad(), "--input-file ", path, ": read error");
  return lines;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void run_embed(EmbedFlags f) {
  const size_t given = f.texts.size();
  if (!f.input_file.empty()) {
    std::vector<std::string> lines = read_input_lines(f.input_file);
    f.texts.insert(f.texts.end(), std::make_move_iterator(lines.begin()),
                   std::make_move_iterator(lines.end()));
  }
  METRALE_CHECK(!f.texts.empty(), "embed: give at least one TEXT or a non-empty --input-file");
  // Names an input for errors: its TEXT position or its line of --input-file.
  auto input_name = [&](size_t i) {
    return i < given ? "TEXT " + std::to_string(i + 1)
                     : "--input-file " + f.input_file + " line " + std::to_string(i - given + 1);
  };
  std::vector<std::vector<int32_t>> inputs;
  if (f.ids) {
    for (size_t i = 0; i < f.texts.size(); ++i)
      inputs.push_back(parse_id_list(f.texts[i], input_name(i) + " (--ids)"));
  }
  std::unique_ptr<Model> model = load_model(f.model);
  const EmbeddingConfig config = load_embedding_config(model->dir(), model->config().hidden_size);
  check_dimensions(config, f.dimensions);
  if (!f.ids) {
    METRALE_CHECK(model->tokenizer() != nullptr, f.model.dir,
                  ": no tokenizer.json; give token ids with --ids");
    for (const std::string& t : f.texts) inputs.push_back(model->tokenizer()->encode(t, true));
  }
  const std::vector<std::vector<float>> out = embed(*model, config, inputs, f.dimensions);
  const int64_t dims = f.dimensions > 0 ? f.dimensions : config.dimension;
  std::fprintf(stderr, "metrale embed: %s pooling%s, %lld values (%s)\n",
               std::string(pooling_name(config.pooling)).c_str(),
               config.normalize ? " + L2 normalisation" : "", static_cast<long long>(dims),
               config.source.c_str());
  nlohmann::json timing;
  if (f.rounds > 0) {
    int64_t tokens = 0;
    for (const std::vector<int32_t>& in : inputs) tokens += static_cast<int64_t>(in.size());
    std::vector<double> seconds;
    for (int64_t r = 0; r < f.rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<std::vector<float>> again = embed(*model, config, inputs, f.dimensions);
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      // Same inputs, same steps: a round that differs would mean the timed work is not the
      // work whose result is printed.
      METRALE_CHECK(again == out, "embed: round ", r + 1, " gave different embeddings");
    }
    const double med = median_of(seconds);
    const double n = static_cast<double>(inputs.size());
    std::fprintf(stderr,
                 "metrale embed: %zu inputs, %lld tokens, %lld rounds, %d threads: median "
                 "%.4f s (%.2f inputs/s, %.1f tokens/s)\n",
                 inputs.size(), static_cast<long long>(tokens), static_cast<long long>(f.rounds),
                 model->pool().size(), med, n / med, static_cast<double>(tokens) / med);
    timing = {{"rounds_s", seconds},
              {"median_s", med},
              {"inputs_per_s", n / med},
              {"tokens", tokens},
              {"tokens_per_s", static_cast<double>(tokens) / med},
              {"threads", model->pool().size()}};
  }
  if (f.json) {
    nlohmann::json data = nlohmann::json::array();
    for (size_t i = 0; i < out.size(); ++i) {
      data.push_back({{"index", i}, {"tokens", inputs[i].size()}, {"embedding", out[i]}});
    }
    nlohmann::json line{{"pooling", pooling_name(config.pooling)},
                        {"normalize", config.normalize},
                        {"dimensions", dims},
                        {"data", data}};
    if (!timing.is_null()) line["timing"] = timing;
    std::printf("%s\n", line.dump().c_str());
    return;
  }
  for (const std::vector<float>& e : out) {
    for (size_t c = 0; c < e.size(); ++c)
      std::printf("%s%.9g", c ? " " : "", static_cast<double>(e[c]));
    std::printf("\n");
  }
}

void setup(CLI::App& app) {
  auto f = std::make_shared<EmbedFlags>();
  auto* cmd = app.add_subcommand(
      "embed", "print one embedding per text (pooled as the checkpoint's modules.json says)");
  f->model.add_to(*cmd);
  cmd->add_option("text", f->texts, "the texts; with --ids, comma-separated token ids (1,2,3)");
  cmd->add_option("--input-file", f->input_file,
                  "also embed each line of FILE, after the TEXTs ('-': standard input)");
  cmd->add_option("--rounds", f->rounds,
                  "time N more passes over all inputs after the first and report the median "
                  "(stderr; \"timing\" in --json)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--dimensions", f->dimensions,
                  "keep the first N values (then normalised again when the model normalises)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_flag("--ids", f->ids, "each TEXT is comma-separated token ids");
  cmd->add_flag("--json", f->json,
                "print one JSON line {pooling, normalize, dimensions, data: [{index, tokens, "
                "embedding}]}");
  cmd->callback([f] { run_embed(*f); });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
