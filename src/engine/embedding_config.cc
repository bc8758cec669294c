#include "engine/embedding_config.h"

#include <array>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json/json_fields.h"
#include "io/json/json_parse.h"

namespace metrale {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw make_error(p.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::filesystem::path& p) {
  return parse_json(read_file(p), p.string());
}

// sentence-transformers' mode names, and the legacy boolean keys in its concatenation order.
constexpr std::array<std::pair<std::string_view, std::string_view>, 6> kLegacyModes = {{
    {"pooling_mode_cls_token", "cls"},
    {"pooling_mode_max_tokens", "max"},
    {"pooling_mode_mean_tokens", "mean"},
    {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"},
    {"pooling_mode_weightedmean_tokens", "weightedmean"},
    {"pooling_mode_lasttoken", "lasttoken"},
}};

Pooling pooling_from_name(const JsonFields& f, std::string_view key, std::string_view mode) {
  if (mode == "lasttoken") return Pooling::kLastToken;
  if (mode == "mean") return Pooling::kMean;
  if (mode == "cls") return Pooling::kCls;
  if (mode == "mean_sqrt_len_tokens") return Pooling::kMeanSqrtLen;
  if (mode == "max" || mode == "weightedmean")
    throw f.error(key, "pooling mode '", mode,
                  "' is not supported (supported: lasttoken, mean, cls, mean_sqrt_len_tokens)");
  throw f.error(key, "unknown pooling mode '", mode,
                "' (sentence-transformers knows cls, max, mean, mean_sqrt_len_tokens, "
                "weightedmean, lasttoken)");
}

// The Pooling module's config.json: its mode, with its width checked against the model's.
Pooling read_pooling(const std::filesystem::path& path, int64_t hidden_size) {
  const nlohmann::json j = read_json(path);
  const JsonFields f(j, path.string());
  const char* dim_key =
      f.has("embedding_dimension") ? "embedding_dimension" : "word_embedding_dimension";
  if (!f.has(dim_key))
    throw f.missing("embedding_dimension", "or word_embedding_dimension: the pooled width");
  const int64_t dim = f.req_int(dim_key, 1);
  if (dim != hidden_size)
    throw f.error(dim_key, "expected the model's hidden size ", hidden_size, ", found ", dim);
  f.opt_bool("include_prompt");  // only matters with a prompt, which is never prepended here
  std::vector<std::string> modes;
  std::string key = "pooling_mode";
  if (const nlohmann::json* m = f.find("pooling_mode")) {
    // The current form: one name or a list of names (several are concatenated).
    if (m->is_string()) {
      modes.push_back(m->get<std::string>());
    } else {
      const JsonList list = f.req_list("pooling_mode");
      for (size_t i = 0; i < list.size(); ++i) modes.push_back(list.string(i));
      if (list.size() == 0) throw f.error("pooling_mode", "expected a mode name, found []");
    }
    for (const auto& [legacy, name] : kLegacyModes) f.opt_bool(legacy);  // still typed
  } else {
    // The legacy form: one boolean per mode; none set is mean, as sentence-transformers reads it.
    for (const auto& [legacy, name] : kLegacyModes) {
      if (f.bool_or(legacy, false)) {
        modes.emplace_back(name);
        key = std::string(legacy);
      }
    }
    if (modes.empty()) modes.emplace_back("mean");
  }
  if (modes.size() > 1) {
    std::string names;
    for (const std::string& m : modes) names += (names.empty() ? "" : ", ") + m;
    const std::string what = "several pooling modes (" + names +
                             ") concatenate their embeddings; only one mode is supported";
    if (f.has("pooling_mode")) throw f.error("pooling_mode", what);
    throw f.error_here(what);
  }
  return pooling_from_name(f, key, modes.front());
}

// Which of the supported modules a modules.json type names: "Transformer", "Pooling",
// "Normalize", or "" for anything else. Both sentence_transformers.models.Pooling (the form
// released checkpoints carry) and the module path of newer versions
// (sentence_transformers.sentence_transformer.modules.pooling.Pooling) are accepted.
std::string_view module_kind(std::string_view type) {
  if (!type.starts_with("sentence_transformers.")) return "";
  for (std::string_view k : {"Transformer", "Pooling", "Normalize"}) {
    if (type.size() > k.size() && type.ends_with(k) && type[type.size() - k.size() - 1] == '.')
      return k;
  }
  return "";
}

struct Module {
  std::string_view kind;
  std::string path;
};

std::vector<Module> read_modules(const std::filesystem::path& path) {
  const nlohmann::json j = read_json(path);
  const JsonList list(j, path.string(), "");
  std::vector<Module> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const JsonFields m = list.object(i);
    m.opt_int("idx");
    m.opt_string("name");
    const std::string type = m.req_string("type");
    const std::string p = m.opt_string("path").value_or("");
    const std::string_view kind = module_kind(type);
    if (kind.empty()) {
      throw m.error("type", "module '", type,
                    "' is not supported (a pipeline of Transformer, Pooling and optionally "
                    "Normalize is)");
    }
    const std::filesystem::path rel(p);
    for (const auto& part : rel) {
      if (part == "..") throw m.error("path", "'", p, "' leaves the model directory");
    }
    if (rel.is_absolute())
      throw m.error("path", "'", p, "' must be relative to the model directory");
    static constexpr std::array<std::string_view, 3> kOrder = {"Transformer", "Pooling",
                                                               "Normalize"};
    if (i >= kOrder.size() || kind != kOrder[i]) {
      throw m.error("type", "expected ", i < kOrder.size() ? kOrder[i] : "no more modules",
                    " at position ", i, " (the pipeline Transformer, Pooling[, Normalize]), found ",
                    kind);
    }
    if (kind == "Transformer" && !p.empty())
      throw m.error(
          "path", "the Transformer must be the model at the directory's root (path \"\"), found '",
          p, "'");
    out.push_back({kind, p});
  }
  if (out.size() < 2) {
    throw make_error(path.string(), ": expected a Transformer then a Pooling module, found ",
                     out.size(), " module(s)");
  }
  return out;
}

}  // namespace

std::string_view pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kLastToken:
      return "lasttoken";
    case Pooling::kMean:
      return "mean";
    case Pooling::kCls:
      return "cls";
    case Pooling::kMeanSqrtLen:
      return "mean_sqrt_len_tokens";
  }
  return "?";
}

EmbeddingConfig load_embedding_config(const std::filesystem::path& dir, int64_t hidden_size) {
  EmbeddingConfig c;
  c.dimension = hidden_size;
  const std::filesystem::path modules = dir / "modules.json";
  if (!std::filesystem::exists(modules)) {
    c.source = "default (no modules.json)";
    return c;
  }
  c.source = modules.string();
  const std::vector<Module> pipeline = read_modules(modules);
  c.pooling = read_pooling(dir / pipeline[1].path / "config.json", hidden_size);
  c.normalize = pipeline.size() > 2;
  if (c.normalize) {
    // Newer versions write the Normalize module's config; it must normalise the pooled vector.
    const std::filesystem::path cfg = dir / pipeline[2].path / "config.json";
    if (std::filesystem::exists(cfg)) {
      const nlohmann::json j = read_json(cfg);
      const JsonFields f(j, cfg.string());
      for (const char* key : {"module_input_name", "module_output_name"}) {
        const std::optional<std::string> v = f.opt_string(key);
        if (v && *v != "sentence_embedding")
          throw f.error(key, "expected \"sentence_embedding\" (the pooled vector), found \"", *v,
                        "\"");
      }
    }
  }
  const std::filesystem::path bert = dir / "sentence_bert_config.json";
  if (std::filesystem::exists(bert)) {
    const nlohmann::json j = read_json(bert);
    const JsonFields f(j, bert.string());
    if (f.has("max_seq_length")) c.max_seq_length = f.req_int("max_seq_length", 1);
    if (f.bool_or("do_lower_case", false))
      throw f.error("do_lower_case", "lower-casing the input is not supported");
  }
  // Without one there, sentence-transformers takes the tokenizer's model_max_length (newer
  // versions save max_seq_length only there). Tokenizers without a limit write a huge float
  // (1e30) or nothing: no limit of its own then.
  const std::filesystem::path tok = dir / "tokenizer_config.json";
  if (c.max_seq_length == 0 && std::filesystem::exists(tok)) {
    const nlohmann::json j = read_json(tok);
    const JsonFields f(j, tok.string());
    const nlohmann::json* m = f.find("model_max_length");
    if (m != nullptr && m->is_number_integer() && m->get<int64_t>() >= 1)
      c.max_seq_length = m->get<int64_t>();
  }
  const std::filesystem::path st = dir / "config_sentence_transformers.json";
  if (std::filesystem::exists(st)) {
    const nlohmann::json j = read_json(st);
    const JsonFields f(j, st.string());
    if (const std::optional<std::string> p = f.opt_string("default_prompt_name")) {
      throw f.error("default_prompt_name", "a default prompt ('", *p,
                    "') is not prepended here; remove it and put the prompt in the input");
    }
    if (const std::optional<int64_t> d = f.opt_int("truncate_dim")) {
      throw f.error("truncate_dim", "a default truncation (", *d,
                    ") is not supported; ask for `dimensions` per request instead");
    }
  }
  return c;
}

}  // namespace metrale
