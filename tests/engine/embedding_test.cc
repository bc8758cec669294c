// Embeddings (engine/embedding.h) against sentence-transformers on the two fixtures of
// tools/fixtures/models/embedding_fixtures.py (tests/data/fixtures/embedding/): last-token
// pooling + Normalize (Qwen3-Embedding's pipeline) and mean pooling without it, within 1e-5
// absolute on f32, with `dimensions`; batching and chunking change no bit; the
// sentence-transformers files are read strictly.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/embedding.h"
#include "engine/model.h"
#include "fixture_util.h"

namespace metrale {
namespace {

namespace fs = std::filesystem;
constexpr float kTolerance = 1e-5f;

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

std::string dir_of(const std::string& name) { return testing::fixture_dir("embedding/" + name); }

nlohmann::json reference(const std::string& name) {
  std::ifstream in(dir_of(name) + "/reference.json");
  return nlohmann::json::parse(in);
}

std::unique_ptr<Model> load(const std::string& name, int64_t max_rows = 128) {
  return Model::load(dir_of(name), {.n_threads = 2, .kv_tokens = 512, .max_rows = max_rows});
}

float max_gap(const std::vector<std::vector<float>>& got, const nlohmann::json& want) {
  float gap = 0;
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    EXPECT_EQ(got[i].size(), want[i].size()) << i;
    for (size_t c = 0; c < got[i].size() && c < want[i].size(); ++c)
      gap = std::max(gap, std::abs(got[i][c] - want[i][c].get<float>()));
  }
  return gap;
}

class EmbeddingParity : public ::testing::TestWithParam<const char*> {};

TEST_P(EmbeddingParity, EqualsSentenceTransformers) {
  const nlohmann::json ref = reference(GetParam());
  auto m = load(GetParam());
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  EXPECT_EQ(pooling_name(c.pooling), ref["pooling"].get<std::string>());
  EXPECT_EQ(c.normalize, ref["normalize"].get<bool>());
  EXPECT_EQ(c.max_seq_length, 128);
  // The tokenizer gives sentence-transformers' ids (the lasttoken fixture's post-processor
  // appends <|endoftext|>).
  std::vector<std::vector<int32_t>> ids;
  for (const auto& t : ref["texts"])
    ids.push_back(m->tokenizer()->encode(t.get<std::string>(), true));
  ASSERT_EQ(ids, ref["ids"].get<std::vector<std::vector<int32_t>>>());
  const std::vector<std::vector<float>> got = embed(*m, c, ids);
  EXPECT_LT(max_gap(got, ref["embeddings"]), kTolerance);
  const int64_t d = ref["dimensions"].get<int64_t>();
  const std::vector<std::vector<float>> cut = embed(*m, c, ids, d);
  EXPECT_LT(max_gap(cut, ref["embeddings_dimensions"]), kTolerance);
  if (c.normalize) {
    for (const auto& v : cut) {
      double ss = 0;
      for (float x : v) ss += static_cast<double>(x) * x;
      EXPECT_NEAR(ss, 1.0, 1e-6);
    }
  }
}

TEST_P(EmbeddingParity, BatchingAndChunkingChangeNoBit) {
  const nlohmann::json ref = reference(GetParam());
  auto m = load(GetParam());
  auto small = load(GetParam(), /*max_rows=*/8);  // the long texts span several steps
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  const auto ids = ref["ids"].get<std::vector<std::vector<int32_t>>>();
  const std::vector<std::vector<float>> batched = embed(*m, c, ids);
  EXPECT_EQ(embed(*small, c, ids), batched);
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<std::vector<int32_t>> one = {ids[i]};
    EXPECT_EQ(embed(*m, c, one).front(), batched[i]) << i;
  }
  EXPECT_EQ(m->kv_pool().free_pages(), m->kv_pool().layout().n_pages);  // all released
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EmbeddingParity, ::testing::Values("lasttoken", "mean"));

TEST(Embedding, BadInputsAndDimensionsAreRefused) {
  auto m = load("lasttoken");
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  const std::vector<std::vector<int32_t>> empty = {{5}, {}};
  EXPECT_EQ(error_of([&] { embed(*m, c, empty); }), "input 1 has no tokens");
  const std::vector<std::vector<int32_t>> too_long = {std::vector<int32_t>(129, 7)};
  EXPECT_EQ(error_of([&] { embed(*m, c, too_long); }),
            "input 0 has 129 tokens; at most 128 fit (sentence_bert_config.json's "
            "max_seq_length)");
  const std::vector<std::vector<int32_t>> bad_id = {{5, 9999}};
  EXPECT_EQ(error_of([&] { embed(*m, c, bad_id); }),
            "input 0: token 1 is 9999, outside the vocabulary [0, " +
                std::to_string(m->vocab_size()) + ")");
  const std::vector<std::vector<int32_t>> ok = {{5, 6}};
  EXPECT_EQ(error_of([&] { embed(*m, c, ok, 33); }),
            "dimensions 33 is outside [1, 32] (the model's embedding has 32 values)");
  EXPECT_EQ(error_of([&] { embed(*m, c, ok, -1); }),
            "dimensions -1 is outside [1, 32] (the model's embedding has 32 values)");
}

TEST(Embedding, FinishDividesCutsThenNormalises) {
  EmbeddingConfig c{.pooling = Pooling::kMean, .normalize = false, .dimension = 4};
  const std::vector<float> sum = {2, 4, -6, 8};
  EXPECT_EQ(finish_embedding(c, sum, 2, 0), (std::vector<float>{1, 2, -3, 4}));
  EXPECT_EQ(finish_embedding(c, sum, 2, 2), (std::vector<float>{1, 2}));
  c.pooling = Pooling::kMeanSqrtLen;
  EXPECT_EQ(finish_embedding(c, sum, 4, 0), (std::vector<float>{1, 2, -3, 4}));
  c = {.pooling = Pooling::kLastToken, .normalize = true, .dimension = 4};
  const std::vector<float> v = {3, 4, 12, 0};
  EXPECT_EQ(finish_embedding(c, v, 1, 2), (std::vector<float>{0.6f, 0.8f}));
  const std::vector<float> full = finish_embedding(c, v, 1, 0);
  EXPECT_FLOAT_EQ(full[2], 12.0f / 13.0f);
  const std::vector<float> zero(4, 0.0f);  // F.normalize's eps: zeros stay zeros
  EXPECT_EQ(finish_embedding(c, zero, 1, 0), zero);
}

TEST(Embedding, ABaseModelWithoutAHeadEmbedsButGivesNoLogits) {
  // The mean fixture is a bare Qwen3Model (no "model." prefix, as sentence-transformers saves
  // it) with tied embeddings; untied, it has no lm_head at all (Qwen3-Embedding-8B ships so).
  const fs::path dir =
      fs::temp_directory_path() / ("metrale_headless_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(dir_of("mean"), dir, fs::copy_options::recursive);
  {
    std::ifstream in(dir / "config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["tie_word_embeddings"] = false;
    std::ofstream(dir / "config.json") << cfg.dump(2);
  }
  auto tied = load("mean");
  auto m = Model::load(dir, {.n_threads = 2, .kv_tokens = 512, .max_rows = 128});
  EXPECT_FALSE(m->architecture().has_head());
  EXPECT_TRUE(tied->architecture().has_head());
  const EmbeddingConfig c = load_embedding_config(m->dir(), m->config().hidden_size);
  const std::vector<std::vector<int32_t>> ids = {{72, 101, 108, 108, 111}, {97}};
  EXPECT_EQ(embed(*m, c, ids), embed(*tied, c, ids));
  Sequence seq;
  std::vector<float> logits(static_cast<size_t>(m->vocab_size()));
  const std::vector<int32_t> prompt = {5, 6};
  EXPECT_NE(error_of([&] {
              m->prefill(seq, prompt, logits);
            }).find(": the checkpoint has no lm_head (a base model saved without its head"),
            std::string::npos);
  EXPECT_TRUE(seq.tokens.empty());
  m.reset();
  fs::remove_all(dir);
}

// A scratch directory holding the sentence-transformers files a test writes.
class ConfigDir {
 public:
  ConfigDir()
      : dir_(fs::temp_directory_path() / ("metrale_embed_cfg_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ConfigDir() { fs::remove_all(dir_); }
  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  const fs::path& path() const { return dir_; }
  std::string error(int64_t hidden = 32) const {
    return error_of([&] { load_embedding_config(dir_, hidden); });
  }

 private:
  fs::path dir_;
};

constexpr const char* kPipeline = R"([
  {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
  {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
])";

TEST(EmbeddingConfig, DefaultIsLastTokenNormalised) {
  ConfigDir d;
  const EmbeddingConfig c = load_embedding_config(d.path(), 32);
  EXPECT_EQ(c.pooling, Pooling::kLastToken);
  EXPECT_TRUE(c.normalize);
  EXPECT_EQ(c.dimension, 32);
  EXPECT_EQ(c.max_seq_length, 0);
  EXPECT_EQ(c.source, "default (no modules.json)");
}

TEST(EmbeddingConfig, ReadsBothPoolingForms) {
  ConfigDir d;
  d.write("modules.json", kPipeline);
  d.write("1_Pooling/config.json", R"({"word_embedding_dimension": 32,
      "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false})");
  EXPECT_EQ(load_embedding_config(d.path(), 32).pooling, Pooling::kCls);
  EXPECT_FALSE(load_embedding_config(d.path(), 32).normalize);
  d.write("1_Pooling/config.json", R"({"word_embedding_dimension": 32})");  // none set: mean
  EXPECT_EQ(load_embedding_config(d.path(), 32).pooling, Pooling::kMean);
  d.write("1_Pooling/config.json",
          R"({"embedding_dimension": 32, "pooling_mode": ["mean_sqrt_len_tokens"]})");
  EXPECT_EQ(load_embedding_config(d.path(), 32).pooling, Pooling::kMeanSqrtLen);
  d.write("tokenizer_config.json", R"({"model_max_length": 1000000000000000019884624838656})");
  EXPECT_EQ(load_embedding_config(d.path(), 32).max_seq_length, 0);
  d.write("tokenizer_config.json", R"({"model_max_length": 512})");
  EXPECT_EQ(load_embedding_config(d.path(), 32).max_seq_length, 512);
  d.write("sentence_bert_config.json", R"({"max_seq_length": 300, "do_lower_case": false})");
  EXPECT_EQ(load_embedding_config(d.path(), 32).max_seq_length, 300);
}

TEST(EmbeddingConfig, BadFilesNameTheFileAndField) {
  ConfigDir d;
  const std::string modules = (d.path() / "modules.json").string();
  const std::string pooling = (d.path() / "1_Pooling" / "config.json").string();
  d.write("modules.json", R"({"idx": 0})");
  EXPECT_EQ(d.error(), modules + ": expected a list, found object {\"idx\":0}");
  d.write(
      "modules.json",
      R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Dense"}])");
  EXPECT_EQ(d.error(), modules +
                           ": field '[1].type': module 'sentence_transformers.models.Dense' is not "
                           "supported (a pipeline of Transformer, Pooling and optionally Normalize "
                           "is)");
  d.write(
      "modules.json",
      R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}])");
  EXPECT_EQ(d.error(),
            modules + ": expected a Transformer then a Pooling module, found 1 module(s)");
  d.write(
      "modules.json",
      R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "../x", "type": "sentence_transformers.models.Pooling"}])");
  EXPECT_EQ(d.error(), modules + ": field '[1].path': '../x' leaves the model directory");
  d.write("modules.json", kPipeline);
  EXPECT_EQ(d.error(), pooling + ": cannot open");
  d.write("1_Pooling/config.json",
          R"({"word_embedding_dimension": 16, "pooling_mode_lasttoken": true})");
  EXPECT_EQ(d.error(), pooling +
                           ": field 'word_embedding_dimension': expected the model's hidden size "
                           "32, found 16");
  d.write("1_Pooling/config.json",
          R"({"word_embedding_dimension": 32, "pooling_mode_max_tokens": true})");
  EXPECT_EQ(d.error(), pooling +
                           ": field 'pooling_mode_max_tokens': pooling mode 'max' is not supported "
                           "(supported: lasttoken, mean, cls, mean_sqrt_len_tokens)");
  d.write(
      "1_Pooling/config.json",
      R"({"word_embedding_dimension": 32, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true})");
  EXPECT_EQ(d.error(), pooling +
                           ": several pooling modes (cls, mean) concatenate their embeddings; "
                           "only one mode is supported");
  d.write("1_Pooling/config.json", R"({"embedding_dimension": 32, "pooling_mode": "lasttokens"})");
  EXPECT_NE(d.error().find("field 'pooling_mode': unknown pooling mode 'lasttokens'"),
            std::string::npos);
  d.write("1_Pooling/config.json",
          R"({"word_embedding_dimension": 32, "pooling_mode_lasttoken": 1})");
  EXPECT_NE(d.error().find("field 'pooling_mode_lasttoken': expected"), std::string::npos);
  d.write("1_Pooling/config.json",
          R"({"word_embedding_dimension": 32, "pooling_mode_lasttoken": true})");
  d.write("sentence_bert_config.json", R"({"max_seq_length": 0})");
  EXPECT_NE(d.error().find("sentence_bert_config.json: field 'max_seq_length'"), std::string::npos);
  d.write("sentence_bert_config.json", R"({"do_lower_case": true})");
  EXPECT_NE(d.error().find("field 'do_lower_case': lower-casing the input is not supported"),
            std::string::npos);
  d.write("sentence_bert_config.json", R"({})");
  d.write("config_sentence_transformers.json",
          R"({"prompts": {"query": "q: "}, "default_prompt_name": "query"})");
  EXPECT_NE(d.error().find("field 'default_prompt_name': a default prompt ('query') is not "
                           "prepended here"),
            std::string::npos);
  d.write("config_sentence_transformers.json", R"({"truncate_dim": 16})");
  EXPECT_NE(d.error().find("field 'truncate_dim'"), std::string::npos);
  d.write("config_sentence_transformers.json",
          R"({"default_prompt_name": null, "truncate_dim": null})");
  EXPECT_EQ(d.error(), "");
}

}  // namespace
}  // namespace metrale
