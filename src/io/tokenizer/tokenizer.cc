#include "io/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/json/json_parse.h"
#include "io/tokenizer/added_vocabulary.h"
#include "io/tokenizer/bpe_model.h"
#include "io/tokenizer/decoder.h"
#include "io/tokenizer/normalizer.h"
#include "io/tokenizer/post_processor.h"
#include "io/tokenizer/pre_tokenizer.h"
#include "io/tokenizer/utf8.h"

namespace metrale {

using namespace tok;

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
  std::vector<AddedTokenInfo> added_info;
  // The pre-tokenizer ends with ByteLevel: the model reads raw bytes (see BpeModel).
  bool byte_level_input = false;
  size_t vocab_size = 0;
  TokenizerConfig config;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  METRALE_CHECK(in.good(), path, ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  METRALE_CHECK(!in.bad(), path, ": read error");
  return ss.str();
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  Tokenizer t = from_json(read_file(path), path);
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    t.impl_->config = parse_tokenizer_config(read_file(config_path.string()), config_path.string());
  }
  return t;
}

Tokenizer Tokenizer::from_json(std::string_view json_text, std::string_view origin) {
  const nlohmann::json doc = parse_json(json_text, origin);
  const JsonFields j(doc, std::string(origin));
  if (std::optional<std::string> version = j.opt_string("version"); version && *version != "1.0") {
    throw j.error("version", "expected \"1.0\", found \"", *version, "\"");
  }
  auto impl = std::make_unique<Impl>();
  if (std::optional<JsonFields> n = j.opt_object("normalizer"))
    impl->normalizer = make_normalizer(*n);
  if (std::optional<JsonFields> p = j.opt_object("pre_tokenizer"))
    impl->pre_tokenizer = make_pre_tokenizer(*p);
  const JsonFields model = j.req_object("model");
  const std::string model_type = model.opt_string("type").value_or("BPE");
  if (model_type != "BPE")
    throw model.error("type", "unsupported model type '", model_type, "' (supported: BPE)");
  impl->model = BpeModel::from_json(model);
  if (std::optional<JsonFields> p = j.opt_object("post_processor"))
    impl->post_processor = make_post_processor(*p);
  if (std::optional<JsonFields> d = j.opt_object("decoder")) impl->decoder = make_decoder(*d);
  if (std::optional<JsonList> added = j.opt_list("added_tokens")) {
    impl->added.load(*added, *impl->model, impl->normalizer.get());
  }
  impl->byte_level_input = impl->pre_tokenizer && impl->pre_tokenizer->defer_byte_mapping();

  size_t extra = 0;
  for (const AddedToken& t : impl->added.tokens()) {
    impl->added_info.push_back(
        {t.content, t.id, t.special, t.single_word, t.lstrip, t.rstrip, t.normalized});
    if (!impl->model->token_to_id(t.content)) ++extra;
  }
  impl->vocab_size = impl->model->vocab_size() + extra;
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string sanitized;
  std::string_view text = input;
  if (utf8_valid_prefix(input) != input.size()) {
    sanitized = utf8_lossy(input);
    text = sanitized;
  }
  thread_local Arena arena;
  thread_local std::vector<Split> splits, next;
  const ScratchScope scratch(arena, splits, next);
  arena.clear();
  splits.clear();
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (!text.empty()) {
    // 1. Added tokens that match the raw text; 2. normalize the rest and match the
    // normalized added tokens in it; 3. pre-tokenize; 4. the model, word by word.
    m.added.split({text, -1, true}, false, splits);
    next.clear();
    for (const Split& s : splits) {
      if (s.id >= 0) {
        next.push_back(s);
        continue;
      }
      Split n = s;
      if (m.normalizer) n.text = m.normalizer->normalize(s.text, arena);
      if (!n.text.empty()) m.added.split(n, true, next);
    }
    splits.swap(next);
    if (m.pre_tokenizer) m.pre_tokenizer->pre_tokenize(splits, arena);
    for (const Split& s : splits) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        m.model->tokenize(s.text, m.byte_level_input, ids);
      }
    }
  }
  if (add_special_tokens && m.post_processor) m.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string* t = m.added.id_to_token(ids[i]);
    if (t == nullptr) t = m.model->id_to_token(ids[i]);
    METRALE_CHECK(t != nullptr, "decode: ids[", i, "] = ", ids[i],
                  " is not in the vocabulary (ids span [0, ", id_limit(), "))");
    // HF tests the token's text, so a special token with a different normalized form is kept.
    if (skip_special_tokens && m.added.is_special_content(*t)) continue;
    tokens.push_back(*t);
  }
  if (!m.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  m.decoder->decode_chain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.token_to_id(token)) return id;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const std::string* t = impl_->added.id_to_token(id)) return *t;
  if (const std::string* t = impl_->model->id_to_token(id)) return *t;
  return std::nullopt;
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

size_t Tokenizer::id_limit() const {
  size_t limit = impl_->model->id_limit();
  for (const AddedToken& t : impl_->added.tokens())
    limit = std::max(limit, static_cast<size_t>(t.id) + 1);
  return limit;
}

const std::vector<AddedTokenInfo>& Tokenizer::added_tokens() const { return impl_->added_info; }

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* t = impl_->added.by_id(id);
  return t != nullptr && t->special;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  if (impl_->config.bos_token) return token_to_id(*impl_->config.bos_token);
  if (impl_->post_processor) {
    auto p = impl_->post_processor->prefix_ids();
    if (!p.empty()) return p.front();
  }
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::eos_id() const {
  if (impl_->config.eos_token) return token_to_id(*impl_->config.eos_token);
  if (impl_->post_processor) {
    auto s = impl_->post_processor->suffix_ids();
    if (!s.empty()) return s.back();
  }
  return std::nullopt;
}

bool Tokenizer::post_processor_adds_bos() const {
  return impl_->post_processor && !impl_->post_processor->prefix_ids().empty();
}

const TokenizerConfig& Tokenizer::config() const { return impl_->config; }
void Tokenizer::set_config(TokenizerConfig config) { impl_->config = std::move(config); }

}  // namespace metrale
