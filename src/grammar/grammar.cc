#include "grammar/grammar.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tokenizer/utf8.h"

#if METRALE_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace metrale {

std::string GrammarSpec::key() const {
  std::string k(1, static_cast<char>('0' + static_cast<int>(kind)));
  if (kind == Kind::kChoice) {
    for (const std::string& c : choices) {
      k += std::to_string(c.size());
      k += ':';
      k += c;
    }
  } else {
    k += std::to_string(prefix.size()) + ':' + prefix + std::to_string(suffix.size()) + ':' +
         suffix + text;
  }
  return k;
}

namespace {

// Keywords xgrammar 0.2.9 accepts and then ignores (it logs a warning): refused here instead,
// so a schema is enforced as written or not at all.
void check_keywords_at(const nlohmann::json& s, const std::string& path, const std::string& field,
                       int depth) {
  METRALE_CHECK(depth < 128, field, ": the schema nests deeper than 128 levels");
  if (s.is_array()) {
    for (size_t i = 0; i < s.size(); ++i)
      check_keywords_at(s[i], path + "/" + std::to_string(i), field, depth + 1);
    return;
  }
  if (!s.is_object()) return;
  static const char* const kRefused[] = {"not",
                                         "if",
                                         "then",
                                         "else",
                                         "dependentRequired",
                                         "dependentSchemas",
                                         "uniqueItems",
                                         "contains",
                                         "minContains",
                                         "maxContains",
                                         "patternProperties",
                                         "propertyNames",
                                         "unevaluatedItems"};
  for (const char* k : kRefused) {
    if (s.contains(k))
      throw make_error(field, ": the JSON schema keyword '", k, "' (at '",
                       path.empty() ? "#" : path, "') is not supported by structured outputs");
  }
  if ((s.contains("pattern") || s.contains("format")) &&
      (s.contains("minLength") || s.contains("maxLength"))) {
    throw make_error(field, ": the JSON schema keywords 'minLength' / 'maxLength' (at '",
                     path.empty() ? "#" : path,
                     "') are not supported together with 'pattern' or 'format'");
  }
  if (s.contains("multipleOf")) {
    const nlohmann::json& t = s.contains("type") ? s["type"] : nlohmann::json();
    if (!(t.is_string() && t.get<std::string>() == "integer"))
      throw make_error(field, ": the JSON schema keyword 'multipleOf' (at '",
                       path.empty() ? "#" : path,
                       "') is supported only with \"type\": \"integer\"");
  }
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    // Values that are data, not schemas.
    if (k == "enum" || k == "const" || k == "default" || k == "examples" || k == "required")
      continue;
    if ((k == "properties" || k == "$defs" || k == "definitions") && it.value().is_object()) {
      // A map from names (which may spell a keyword) to schemas.
      for (auto p = it.value().begin(); p != it.value().end(); ++p)
        check_keywords_at(p.value(), path + "/" + k + "/" + p.key(), field, depth + 1);
      continue;
    }
    check_keywords_at(it.value(), path + "/" + k, field, depth + 1);
  }
}

// An EBNF string literal of `s` (UTF-8 kept; quotes, backslashes and control bytes escaped).
[[maybe_unused]] std::string ebnf_literal(const std::string& s) {  // used only with xgrammar
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

void check_schema_keywords(const std::string& schema_json, const std::string& field) {
  nlohmann::json s = nlohmann::json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  METRALE_CHECK(!s.is_discarded(), field, ": the JSON schema is not valid JSON");
  METRALE_CHECK(s.is_object() || s.is_boolean(), field,
                ": the JSON schema must be an object, found ", s.type_name());
  check_keywords_at(s, "", field, 0);
}

#if METRALE_HAVE_XGRAMMAR

bool grammar_available() { return true; }

class CompiledGrammar {
 public:
  explicit CompiledGrammar(xgrammar::CompiledGrammar g) : g_(std::move(g)) {}
  const xgrammar::CompiledGrammar& get() const { return g_; }

 private:
  xgrammar::CompiledGrammar g_;
};

namespace {

enum class VocabKind : uint8_t { kRaw, kByteLevel, kByteFallback };

VocabKind detect_vocab_kind(const std::vector<std::string>& vocab) {
  bool byte_level = false;
  for (const std::string& t : vocab) {
    if (t == "<0x0A>" || t == "<0x00>") return VocabKind::kByteFallback;
    // GPT-2's byte-to-unicode map writes ' ' as U+0120 and '\n' as U+010A.
    if (t.find("\xC4\xA0") != std::string::npos || t.find("\xC4\x8A") != std::string::npos)
      byte_level = true;
  }
  return byte_level ? VocabKind::kByteLevel : VocabKind::kRaw;
}

// The bytes a vocabulary token adds to the output, as the tokenizer's decoders produce them
// (before the UTF-8 repair of a whole decode): GPT-2's byte map undone (a token with a
// character outside it, an added token, is its own UTF-8), SentencePiece's <0xNN> and U+2581.
std::string token_bytes(const std::string& t, VocabKind kind) {
  if (kind == VocabKind::kByteLevel) {
    std::string out;
    for (size_t i = 0; i < t.size();) {
      char32_t c = 0;
      i += tok::utf8_decode(t, i, &c);
      const int b = tok::char_to_byte(c);
      if (b < 0) return t;
      out.push_back(static_cast<char>(b));
    }
    return out;
  }
  if (kind == VocabKind::kByteFallback) {
    if (t.size() == 6 && t.starts_with("<0x") && t.ends_with(">")) {
      return std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
    }
    std::string out;
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, "\xE2\x96\x81") == 0) {
        out += ' ';
        i += 3;
      } else {
        out += t[i++];
      }
    }
    return out;
  }
  return t;
}

// xgrammar's message without its "[hh:mm:ss] path/file.cc:line: " prefix.
std::string engine_message(std::string m) {
  if (m.starts_with("[")) {
    const size_t close = m.find("] ");
    const size_t colon = close == std::string::npos ? close : m.find(": ", close + 2);
    if (colon != std::string::npos && m.find(".cc:", close) < colon) m = m.substr(colon + 2);
  }
  return m;
}

}  // namespace

struct GrammarCompiler::Impl {
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const CompiledGrammar>> cache;
  Impl(xgrammar::TokenizerInfo i, int threads)
      : info(std::move(i)), compiler(info, threads, /*cache_enabled=*/false) {}
};

namespace {

xgrammar::TokenizerInfo make_info(const Tokenizer& tok, int64_t vocab_size,
                                  const std::vector<int32_t>& eos_ids) {
  int64_t n = static_cast<int64_t>(tok.id_limit());
  METRALE_CHECK(vocab_size >= n, "grammar: the logits width ", vocab_size,
                " is below the tokenizer's ", n, " ids");
  METRALE_CHECK(vocab_size <= std::numeric_limits<int>::max(), "grammar: vocabulary too large");
  std::vector<std::string> vocab(static_cast<size_t>(n));
  std::vector<bool> added(static_cast<size_t>(n), false);
  for (const AddedTokenInfo& a : tok.added_tokens())
    if (a.id >= 0 && a.id < n) added[static_cast<size_t>(a.id)] = true;
  for (int64_t i = 0; i < n; ++i) {
    if (std::optional<std::string> t = tok.id_to_token(static_cast<int32_t>(i)))
      vocab[static_cast<size_t>(i)] = std::move(*t);
  }
  const VocabKind kind = detect_vocab_kind(vocab);
  for (int64_t i = 0; i < n; ++i) {
    std::string& t = vocab[static_cast<size_t>(i)];
    // Empty: xgrammar's "special" tokens, never allowed by a grammar (the eos ids are stop
    // tokens instead: allowed at an accept state).
    if (tok.is_special(static_cast<int32_t>(i))) {
      t.clear();
    } else if (!added[static_cast<size_t>(i)]) {
      t = token_bytes(t, kind);
    }
  }
  std::vector<int32_t> stops;
  for (int32_t e : eos_ids)
    if (e >= 0 && e < vocab_size) stops.push_back(e);
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, static_cast<int>(vocab_size),
                                 stops, false);
}

}  // namespace

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int64_t vocab_size,
                                 std::vector<int32_t> eos_ids)
    : vocab_size_(vocab_size) {
  int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  impl_ = std::make_unique<Impl>(make_info(tokenizer, vocab_size, eos_ids), threads);
}

GrammarCompiler::~GrammarCompiler() = default;

size_t GrammarCompiler::cached() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cache.size();
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  const std::string key = spec.key();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) return it->second;
  }
  std::optional<xgrammar::CompiledGrammar> g;
  try {
    switch (spec.kind) {
      case GrammarSpec::Kind::kJsonObject:
        // Any JSON object (OpenAI's json_object; xgrammar's builtin grammar is any value).
        g = impl_->compiler.CompileJSONSchema(R"({"type":"object"})", /*any_whitespace=*/false,
                                              std::nullopt,
                                              std::make_pair(std::string(","), std::string(":")),
                                              /*strict_mode=*/false);
        break;
      case GrammarSpec::Kind::kJsonSchema:
        check_schema_keywords(spec.text, spec.field);
        // Compact separators (no free whitespace): a weak model cannot wander in blanks.
        if (spec.prefix.empty() && spec.suffix.empty()) {
          g = impl_->compiler.CompileJSONSchema(spec.text, /*any_whitespace=*/false, std::nullopt,
                                                std::make_pair(std::string(","), std::string(":")),
                                                /*strict_mode=*/true);
        } else {
          std::vector<xgrammar::Grammar> parts;
          if (!spec.prefix.empty())
            parts.push_back(xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(spec.prefix)));
          parts.push_back(xgrammar::Grammar::FromJSONSchema(
              spec.text, /*any_whitespace=*/false, std::nullopt,
              std::make_pair(std::string(","), std::string(":")), /*strict_mode=*/true));
          if (!spec.suffix.empty())
            parts.push_back(xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(spec.suffix)));
          g = impl_->compiler.CompileGrammar(xgrammar::Grammar::Concat(parts));
        }
        break;
      case GrammarSpec::Kind::kRegex:
        g = impl_->compiler.CompileRegex(spec.text);
        break;
      case GrammarSpec::Kind::kEbnf:
        g = impl_->compiler.CompileGrammar(spec.text, "root");
        break;
      case GrammarSpec::Kind::kChoice: {
        METRALE_CHECK(!spec.choices.empty(), spec.field, ": the choice list is empty");
        std::string ebnf = "root ::= ";
        for (size_t i = 0; i < spec.choices.size(); ++i) {
          METRALE_CHECK(!spec.choices[i].empty(), spec.field, "[", i, "]: an empty choice");
          ebnf += (i ? " | " : "") + ebnf_literal(spec.choices[i]);
        }
        g = impl_->compiler.CompileGrammar(ebnf, "root");
        break;
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw make_error(spec.field, ": ", engine_message(e.what()));
  }
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*g));
  // A grammar no token can start (and that does not match the empty output) matches nothing.
  GrammarMatcher probe(compiled);
  std::vector<uint32_t> mask(probe.mask_words());
  probe.fill_mask(mask);
  bool any = std::any_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; });
  METRALE_CHECK(any, spec.field, ": the grammar matches no output over this tokenizer");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->cache.size() >= 256) impl_->cache.clear();
  impl_->cache.emplace(key, compiled);
  return compiled;
}

struct GrammarMatcher::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher m;
  int64_t vocab;
  std::vector<uint32_t> mask;
  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : grammar(std::move(g)),
        m(grammar->get()),
        vocab(grammar->get().GetTokenizerInfo().GetVocabSize()) {}
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

int64_t GrammarMatcher::vocab_size() const { return impl_->vocab; }
size_t GrammarMatcher::mask_words() const {
  return static_cast<size_t>(xgrammar::GetBitmaskSize(static_cast<int>(impl_->vocab)));
}

bool GrammarMatcher::fill_mask(std::span<uint32_t> mask) {
  METRALE_CHECK(mask.size() == mask_words(), "grammar mask: ", mask.size(), " words, expected ",
                mask_words());
  int64_t shape[1] = {static_cast<int64_t>(mask.size())};
  DLTensor t{};
  t.data = mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return impl_->m.FillNextTokenBitmask(&t, 0);
}

void GrammarMatcher::apply_mask(std::span<float> logits) {
  METRALE_CHECK(static_cast<int64_t>(logits.size()) == impl_->vocab, "grammar mask: a row of ",
                logits.size(), " logits, expected ", impl_->vocab);
  impl_->mask.resize(mask_words());
  if (!fill_mask(impl_->mask)) return;
  const float ninf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t w = 0; w < impl_->mask.size(); ++w) {
    uint32_t word = impl_->mask[w];
    if (word == 0xffffffffu) continue;
    size_t end = std::min(n, (w + 1) * 32);
    for (size_t i = w * 32; i < end; ++i)
      if (!((word >> (i - w * 32)) & 1u)) logits[i] = ninf;
  }
}

bool GrammarMatcher::accept(int32_t token) {
  if (token < 0 || token >= impl_->vocab) return false;
  return impl_->m.AcceptToken(token);
}
void GrammarMatcher::rollback(size_t n) {
  if (n) impl_->m.Rollback(static_cast<int>(n));
}
bool GrammarMatcher::terminated() const { return impl_->m.IsTerminated(); }
bool GrammarMatcher::completed() const { return impl_->m.IsCompleted(); }

#else  // built without xgrammar

bool grammar_available() { return false; }

class CompiledGrammar {};

struct GrammarCompiler::Impl {};

GrammarCompiler::GrammarCompiler(const Tokenizer&, int64_t vocab_size, std::vector<int32_t>)
    : vocab_size_(vocab_size) {}
GrammarCompiler::~GrammarCompiler() = default;
size_t GrammarCompiler::cached() const { return 0; }
std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  throw make_error(spec.field,
                   ": structured outputs are unavailable: this metrale was built without "
                   "xgrammar (scripts/fetch-xgrammar.sh)");
}

struct GrammarMatcher::Impl {};
GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar>) {
  throw Error("grammar: built without xgrammar");
}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;
int64_t GrammarMatcher::vocab_size() const { return 0; }
size_t GrammarMatcher::mask_words() const { return 0; }
bool GrammarMatcher::fill_mask(std::span<uint32_t>) { return false; }
void GrammarMatcher::apply_mask(std::span<float>) {}
bool GrammarMatcher::accept(int32_t) { return false; }
void GrammarMatcher::rollback(size_t) {}
bool GrammarMatcher::terminated() const { return false; }
bool GrammarMatcher::completed() const { return false; }

#endif

}  // namespace metrale
