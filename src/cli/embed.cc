// `metrale embed --model DIR [--json] [--dimensions N] [--ids] TEXT...`: one embedding per TEXT,
// pooled and normalised as the checkpoint's sentence-transformers files say
// (engine/embedding_config.h; without them last-token pooling + L2 normalisation). TEXTs are
// tokenized with the tokenizer's special tokens, as sentence-transformers encodes them; with
// --ids each TEXT is comma-separated token ids instead. All inputs share steps.
//
// Output: one line per input, its values separated by spaces (each printed exactly: %.9g
// reads back to the same f32); --json: one line {"pooling", "normalize", "dimensions",
// "data": [{"index", "tokens", "embedding"}]}. What the pipeline is goes to stderr.
#include <cstdio>
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
  int64_t dimensions = 0;
  bool ids = false;
  bool json = false;
};

void run_embed(EmbedFlags f) {
  METRALE_CHECK(!f.texts.empty(), "embed: give at least one TEXT");
  std::vector<std::vector<int32_t>> inputs;
  if (f.ids) {
    for (size_t i = 0; i < f.texts.size(); ++i)
      inputs.push_back(parse_id_list(f.texts[i], "TEXT " + std::to_string(i + 1) + " (--ids)"));
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
  if (f.json) {
    nlohmann::json data = nlohmann::json::array();
    for (size_t i = 0; i < out.size(); ++i) {
      data.push_back({{"index", i}, {"tokens", inputs[i].size()}, {"embedding", out[i]}});
    }
    const nlohmann::json j{{"pooling", pooling_name(config.pooling)},
                           {"normalize", config.normalize},
                           {"dimensions", dims},
                           {"data", data}};
    std::printf("%s\n", j.dump().c_str());
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
  cmd->add_option("text", f->texts, "the texts; with --ids, comma-separated token ids (1,2,3)")
      ->required();
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
