// What reaches xgrammar from outside (grammar_text.h): the checks of a request's grammar text,
// EBNF literals, the vocabulary's bytes and the structural tag's resolution.
#include "grammar/grammar_text.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar.h"
#include "io/tokenizer/utf8.h"

namespace metrale::grammar_detail {

// xgrammar reads "\x" followed by any number of hex digits as one codepoint, in an int that
// overflows (undefined behaviour, found by fuzz/grammar_compile_fuzz.cc): an escape past
// U+10FFFF is refused here, naming `what` (the field, or the schema path of a pattern).
void check_hex_escapes(std::string_view text, const std::string& what) {
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (text[i] != '\\') continue;
    if (text[i + 1] == 'x') {
      uint64_t value = 0;
      size_t j = i + 2;
      for (; j < text.size() && std::isxdigit(static_cast<unsigned char>(text[j])); ++j) {
        const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(text[j])));
        value = std::min<uint64_t>(
            value * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10),
            uint64_t{1} << 32);
      }
      METRALE_CHECK(value <= 0x10FFFF, what, ": the escape '",
                    text.substr(i, std::min<size_t>(j - i, 16)), j - i > 16 ? "...'" : "'",
                    " (at byte ", i, ") is past U+10FFFF, the last Unicode codepoint");
    }
    ++i;  // the escaped character (a backslash too) is not an escape's start
  }
}

// An EBNF string literal of `s` (UTF-8 kept; quotes, backslashes and control bytes escaped,
// the latter as \u00XX: xgrammar's \x takes every hex digit that follows).
std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
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
  if (s.contains("pattern") && s["pattern"].is_string())
    check_hex_escapes(s["pattern"].get<std::string>(),
                      field + " ('pattern' at '" + (path.empty() ? "#" : path) + "')");
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

// Stands for the bytes FF FE in a structural tag while it is JSON text (nlohmann::json holds
// UTF-8 only); the dump spells it "\u0001special\u0001".
constexpr const char* kSpecialMark = "\x01special\x01";
constexpr std::string_view kSpecialMarkDumped = "\\u0001special\\u0001";

// Walks a structural tag's formats: checks each "json_schema" as a kJsonSchema spec's, and
// turns each "token" given as text into the id of the added token of that text, or into that
// text as a "const_string" where the tokenizer has no such token; each "any_text" excludes the
// special tokens' text (GrammarCompiler::Impl).
// The added token a resolved "token" element names, or null.
const AddedTokenInfo* token_of(const nlohmann::ordered_json& f,
                               const std::map<std::string, AddedTokenInfo, std::less<>>& added) {
  if (f.value("type", "") != "token" || !f.contains("token") || !f["token"].is_number_integer())
    return nullptr;
  const int32_t id = f["token"].get<int32_t>();
  for (const auto& [text, info] : added)
    if (info.id == id) return &info;
  return nullptr;
}

void resolve_formats(nlohmann::ordered_json& f, const std::string& field,
                     const std::map<std::string, AddedTokenInfo, std::less<>>& added, int depth) {
  METRALE_CHECK(depth < 64, field, ": the structural tag nests deeper than 64 levels");
  if (f.is_array()) {
    for (nlohmann::ordered_json& e : f) resolve_formats(e, field, added, depth + 1);
    return;
  }
  if (!f.is_object()) return;
  const auto type = f.find("type");
  if (type != f.end() && *type == "json_schema") {
    const auto schema = f.find("json_schema");
    METRALE_CHECK(schema != f.end(), field, ": a json_schema format without its schema");
    check_schema_keywords(schema->dump(), field);
    return;
  }
  if (type != f.end() && *type == "token" && f.contains("token") && f["token"].is_string()) {
    const std::string text = f["token"].get<std::string>();
    if (const auto it = added.find(text); it != added.end()) {
      f["token"] = it->second.id;
    } else {
      f = {{"type", "const_string"}, {"value", text}};
    }
    return;
  }
  if (type != f.end() && *type == "any_text") {
    // Any text is any bytes to xgrammar: it must also exclude the special tokens' FF FE.
    f["excludes"].push_back(kSpecialMark);
    return;
  }
  const bool tag = type != f.end() && *type == "tag";
  for (auto& [key, value] : f.items()) {
    if (!value.is_object() && !value.is_array()) continue;
    resolve_formats(value, field, added, depth + 1);
    // A tag's begin and end are a token or text (a string), not any format; xgrammar 0.2.9
    // ends any text at a token only when that token is one it cannot read as text (special),
    // so a non-special one is its text there (which matches the token too).
    if (tag && (key == "begin" || key == "end") && value.is_object()) {
      if (value.value("type", "") == "const_string") {
        value = value["value"];
      } else if (const AddedTokenInfo* t = token_of(value, added); t != nullptr && !t->special) {
        value = t->content;
      }
    }
  }
}

}  // namespace

}  // namespace metrale::grammar_detail

namespace metrale {

void check_schema_keywords(const std::string& schema_json, const std::string& field) {
  nlohmann::json s = nlohmann::json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  METRALE_CHECK(!s.is_discarded(), field, ": the JSON schema is not valid JSON");
  METRALE_CHECK(s.is_object() || s.is_boolean(), field,
                ": the JSON schema must be an object, found ", s.type_name());
  grammar_detail::check_keywords_at(s, "", field, 0);
}

}  // namespace metrale

namespace metrale::grammar_detail {

// The bytes each token id adds to the output, as xgrammar reads them (RAW vocabulary). Special
// tokens add none (xgrammar's "special" tokens, never allowed by a grammar; the eos ids are stop
// tokens instead: allowed at an accept state), or with `markers` keep their text behind FF FE
// (GrammarCompiler::Impl).
std::vector<std::string> vocab_bytes(const Tokenizer& tok, int64_t vocab_size, bool markers) {
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
    if (tok.is_special(static_cast<int32_t>(i))) {
      if (markers && !t.empty()) {
        t = "\xFF\xFE" + t;
      } else {
        t.clear();
      }
    } else if (!added[static_cast<size_t>(i)]) {
      t = token_bytes(t, kind);
    }
  }
  return vocab;
}

std::string resolve_structural_tag(
    const std::string& text, const std::string& field,
    const std::map<std::string, AddedTokenInfo, std::less<>>& added) {
  // (Ordered: a schema's properties are written in the order it gives them.)
  nlohmann::ordered_json tag =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  METRALE_CHECK(!tag.is_discarded() && tag.is_object(), field,
                ": the structural tag is not a JSON object");
  resolve_formats(tag, field, added, 0);
  std::string out = tag.dump();
  for (size_t at = out.find(kSpecialMarkDumped); at != std::string::npos;
       at = out.find(kSpecialMarkDumped, at)) {
    out.replace(at, kSpecialMarkDumped.size(), "\xFF\xFE");
  }
  return out;
}

}  // namespace metrale::grammar_detail
