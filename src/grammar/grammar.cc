#include "grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/utf8_guard.h"
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

// An EBNF string literal of `s` (UTF-8 kept; quotes, backslashes and control bytes escaped,
// the latter as \u00XX: xgrammar's \x takes every hex digit that follows).
[[maybe_unused]] std::string ebnf_literal(const std::string& s) {  // used only with xgrammar
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

}  // namespace

void check_schema_keywords(const std::string& schema_json, const std::string& field) {
  nlohmann::json s = nlohmann::json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  METRALE_CHECK(!s.is_discarded(), field, ": the JSON schema is not valid JSON");
  METRALE_CHECK(s.is_object() || s.is_boolean(), field,
                ": the JSON schema must be an object, found ", s.type_name());
  check_keywords_at(s, "", field, 0);
}

int grammar_mask_threads() {
  static const int n = [] {
    if (const char* env = std::getenv("METRALE_GRAMMAR_THREADS"); env != nullptr) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      METRALE_CHECK(end != env && *end == '\0' && v >= 0 && v <= 64,
                    "METRALE_GRAMMAR_THREADS: expected an integer in [0, 64], found '", env, "'");
      return static_cast<int>(v);
    }
    return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 4, 1u, 4u));
  }();
  return n;
}

void apply_token_mask(std::span<const uint32_t> mask, std::span<float> logits) {
  const size_t n = logits.size();
  METRALE_CHECK(mask.size() * 32 >= n, "grammar mask: ", mask.size(), " words for ", n, " logits");
  const float ninf = -std::numeric_limits<float>::infinity();
  float* row = logits.data();
  for (size_t w = 0, base = 0; base < n; ++w, base += 32) {
    const uint32_t word = mask[w];
    if (word == 0xffffffffu) continue;
    const size_t len = std::min<size_t>(32, n - base);
    if (word == 0) {
      std::fill_n(row + base, len, ninf);
      continue;
    }
    uint32_t off = ~word;
    if (len < 32) off &= (1u << len) - 1u;
    for (; off != 0; off &= off - 1) row[base + static_cast<size_t>(std::countr_zero(off))] = ninf;
  }
}

#if METRALE_HAVE_XGRAMMAR

bool grammar_available() { return true; }

class CompiledGrammar {
 public:
  CompiledGrammar(xgrammar::CompiledGrammar g, std::shared_ptr<const Utf8Guard> guard)
      : g_(std::move(g)), guard_(std::move(guard)) {}
  const xgrammar::CompiledGrammar& get() const { return g_; }
  const Utf8Guard& guard() const { return *guard_; }

 private:
  xgrammar::CompiledGrammar g_;
  std::shared_ptr<const Utf8Guard> guard_;  // the tokenizer's, shared by its grammars
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
  // Structural tags compile over a second view of the vocabulary in which the special tokens
  // are tokens a "token" element can name (xgrammar's token edges skip the tokens it counts as
  // special, those of empty text): each is its text behind the bytes FF FE, which no UTF-8
  // text matches, so no text element (a JSON string, a regex, an XML value) ever allows one.
  xgrammar::TokenizerInfo marker_info;
  xgrammar::GrammarCompiler marker_compiler;
  std::map<std::string, AddedTokenInfo, std::less<>> added;  // added tokens by their text
  std::shared_ptr<const Utf8Guard> guard;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const CompiledGrammar>> cache;
  Impl(xgrammar::TokenizerInfo i, xgrammar::TokenizerInfo mi, int threads)
      : info(std::move(i)),
        compiler(info, threads, /*cache_enabled=*/false),
        marker_info(std::move(mi)),
        marker_compiler(marker_info, threads, /*cache_enabled=*/false) {}
};

namespace {

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

xgrammar::TokenizerInfo make_info(std::vector<std::string> vocab, int64_t vocab_size,
                                  const std::vector<int32_t>& eos_ids) {
  std::vector<int32_t> stops;
  for (int32_t e : eos_ids)
    if (e >= 0 && e < vocab_size) stops.push_back(e);
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, static_cast<int>(vocab_size),
                                 stops, false);
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

}  // namespace

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int64_t vocab_size,
                                 std::vector<int32_t> eos_ids)
    : vocab_size_(vocab_size) {
  int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  std::vector<std::string> bytes = vocab_bytes(tokenizer, vocab_size, /*markers=*/false);
  auto guard = std::make_shared<const Utf8Guard>(bytes, vocab_size);
  impl_ = std::make_unique<Impl>(
      make_info(std::move(bytes), vocab_size, eos_ids),
      make_info(vocab_bytes(tokenizer, vocab_size, /*markers=*/true), vocab_size, eos_ids),
      threads);
  impl_->guard = std::move(guard);
  for (const AddedTokenInfo& a : tokenizer.added_tokens()) impl_->added.emplace(a.content, a);
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
      case GrammarSpec::Kind::kStructuralTag:
        g = impl_->marker_compiler.CompileStructuralTag(
            resolve_structural_tag(spec.text, spec.field, impl_->added));
        break;
      case GrammarSpec::Kind::kRegex:
        check_hex_escapes(spec.text, spec.field);
        g = impl_->compiler.CompileRegex(spec.text);
        break;
      case GrammarSpec::Kind::kEbnf:
        check_hex_escapes(spec.text, spec.field);
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
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*g), impl_->guard);
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

namespace {

// The mask workers: matchers whose next mask is wanted wait in `queue`; the threads take them
// in turn. One mutex guards the queue and every matcher's fill state, so a matcher's owner
// and a worker never touch its xgrammar state at once: a worker owns it from kQueued (taken
// off the queue) until it sets kReady, and an owner that wants it back first takes a queued
// fill off the queue (to run it itself, or to drop it) or waits for a running one.
enum class Fill : uint8_t { kNone, kQueued, kRunning, kReady };

struct FillJob {
  Fill state = Fill::kNone;  // under MaskWorkers::mu
  bool restricts = false;    // kReady: fill's result (false: every token allowed)
  std::exception_ptr error;  // kReady: what the fill threw
  virtual void run() = 0;    // fills the mask (no lock held)
  virtual ~FillJob() = default;
};

class MaskWorkers {
 public:
  // Null when METRALE_GRAMMAR_THREADS is 0. Started on first use and never stopped (a fill
  // may still be wanted by a matcher destroyed during the process's exit).
  static MaskWorkers* get() {
    static MaskWorkers* const w =
        grammar_mask_threads() > 0 ? new MaskWorkers(grammar_mask_threads()) : nullptr;
    return w;
  }

  void push(FillJob& j) {
    {
      std::lock_guard lock(mu_);
      if (j.state != Fill::kNone) return;
      j.state = Fill::kQueued;
      queue_.push_back(&j);
    }
    work_cv_.notify_one();
  }

  // What settle() does with a fill still queued.
  enum class Queued : uint8_t {
    kRun,   // takes it off the queue and runs it on the calling thread
    kDrop,  // takes it off the queue
    kKeep,  // leaves it queued: no worker starts it while the returned lock is held
  };

  // Gives `j` back to its owner: a running fill is waited for (kRun: while filling other
  // queued masks), a queued one as `how` says. Returns with the lock held (the caller may
  // then read j's results).
  std::unique_lock<std::mutex> settle(FillJob& j, Queued how) {
    std::unique_lock lock(mu_);
    if (j.state == Fill::kQueued && how != Queued::kKeep) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), &j));
      j.state = Fill::kNone;
      if (how == Queued::kRun) {
        j.state = Fill::kRunning;  // (no worker can see it: it is off the queue)
        lock.unlock();
        finish(j);
        lock.lock();
      }
    }
    while (j.state == Fill::kRunning) {
      if (how == Queued::kRun && !queue_.empty()) {
        // The pick waits on a worker: meanwhile it fills the mask wanted last (the rows of
        // a step are picked in the order their fills were queued).
        FillJob& other = *queue_.back();
        queue_.pop_back();
        other.state = Fill::kRunning;
        lock.unlock();
        finish(other);
        lock.lock();
        continue;
      }
      done_cv_.wait(lock);
    }
    return lock;
  }

 private:
  explicit MaskWorkers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
  }

  // Runs j (state kRunning, no lock held), then publishes its result.
  void finish(FillJob& j) {
    std::exception_ptr error;
    try {
      j.run();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      j.error = error;
      j.state = Fill::kReady;
    }
    done_cv_.notify_all();
  }

  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !queue_.empty(); });
      FillJob& j = *queue_.front();
      queue_.pop_front();
      j.state = Fill::kRunning;
      lock.unlock();
      finish(j);
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<FillJob*> queue_;
  std::vector<std::thread> threads_;
};

}  // namespace

struct GrammarMatcher::Impl final : FillJob {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher m;
  int64_t vocab;
  std::vector<uint32_t> mask;  // the prefetched mask (kReady)
  MaskWorkers* workers = MaskWorkers::get();
  // Where the output stands inside a UTF-8 character, and before each accepted token (the
  // rollback's history).
  Utf8State utf8;
  std::vector<Utf8State> utf8_before;
  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : grammar(std::move(g)),
        m(grammar->get()),
        vocab(grammar->get().GetTokenizerInfo().GetVocabSize()),
        mask(static_cast<size_t>(xgrammar::GetBitmaskSize(static_cast<int>(vocab)))) {}
  ~Impl() override { release(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  bool fill(std::span<uint32_t> out) {
    int64_t shape[1] = {static_cast<int64_t>(out.size())};
    DLTensor t{};
    t.data = out.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = shape;
    t.strides = nullptr;
    t.byte_offset = 0;
    bool narrowed = m.FillNextTokenBitmask(&t, 0);
    if (!narrowed && utf8.need > 0) {
      std::fill(out.begin(), out.end(), ~0u);
      narrowed = true;
    }
    if (narrowed) grammar->guard().restrict(utf8, out);
    return narrowed;
  }
  void run() override { restricts = fill(mask); }

  // The matcher back from the workers (a running fill finished, a queued one as `how` says),
  // while the returned lock is held (kKeep) or until the next prefetch().
  std::unique_lock<std::mutex> own(MaskWorkers::Queued how) {
    return workers != nullptr ? workers->settle(*this, how) : std::unique_lock<std::mutex>();
  }
  void release() { own(MaskWorkers::Queued::kDrop); }
  // The matcher is about to move: the prefetched mask is stale.
  void invalidate() {
    auto lock = own(MaskWorkers::Queued::kDrop);
    state = Fill::kNone;
  }
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

int64_t GrammarMatcher::vocab_size() const { return impl_->vocab; }
size_t GrammarMatcher::mask_words() const { return impl_->mask.size(); }

bool GrammarMatcher::fill_mask(std::span<uint32_t> mask) {
  METRALE_CHECK(mask.size() == mask_words(), "grammar mask: ", mask.size(), " words, expected ",
                mask_words());
  impl_->release();
  return impl_->fill(mask);
}

void GrammarMatcher::prefetch() {
  Impl& i = *impl_;
  if (i.workers == nullptr) return;
  {
    // (The owner's thread: no worker holds the matcher unless it is queued or running, and
    // then push() does nothing.)
    auto lock = i.own(MaskWorkers::Queued::kKeep);
    if (i.state != Fill::kNone) return;  // queued, or filled already
  }
  if (i.m.IsTerminated()) return;
  i.workers->push(i);
}

void GrammarMatcher::apply_mask(std::span<float> logits) {
  METRALE_CHECK(static_cast<int64_t>(logits.size()) == impl_->vocab, "grammar mask: a row of ",
                logits.size(), " logits, expected ", impl_->vocab);
  Impl& i = *impl_;
  bool ready = false;
  if (i.workers != nullptr) {
    auto lock = i.own(MaskWorkers::Queued::kRun);
    ready = i.state == Fill::kReady;
    if (ready && i.error) {
      std::exception_ptr e = i.error;
      i.error = nullptr;
      i.state = Fill::kNone;
      std::rethrow_exception(e);
    }
  }
  // (Not kReady: nothing is queued or running, so the matcher is the caller's alone.)
  if (!ready) i.restricts = i.fill(i.mask);
  if (i.restricts) apply_token_mask(i.mask, logits);
}

bool GrammarMatcher::accept(int32_t token) {
  Impl& i = *impl_;
  if (token < 0 || token >= i.vocab) return false;
  i.invalidate();
  const std::optional<Utf8State> next = i.grammar->guard().after(i.utf8, token);
  if (!next || !i.m.AcceptToken(token)) return false;
  i.utf8_before.push_back(i.utf8);
  i.utf8 = *next;
  return true;
}
void GrammarMatcher::rollback(size_t n) {
  if (n == 0) return;
  Impl& i = *impl_;
  METRALE_CHECK(n <= i.utf8_before.size(), "grammar: rolling back ", n, " tokens of ",
                i.utf8_before.size(), " accepted");
  i.invalidate();
  i.m.Rollback(static_cast<int>(n));
  i.utf8 = i.utf8_before[i.utf8_before.size() - n];
  i.utf8_before.resize(i.utf8_before.size() - n);
}
bool GrammarMatcher::terminated() const {
  auto lock = impl_->own(MaskWorkers::Queued::kKeep);
  return impl_->m.IsTerminated();
}
bool GrammarMatcher::completed() const {
  auto lock = impl_->own(MaskWorkers::Queued::kKeep);
  return impl_->m.IsCompleted();
}

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
void GrammarMatcher::prefetch() {}
void GrammarMatcher::apply_mask(std::span<float>) {}
bool GrammarMatcher::accept(int32_t) { return false; }
void GrammarMatcher::rollback(size_t) {}
bool GrammarMatcher::terminated() const { return false; }
bool GrammarMatcher::completed() const { return false; }

#endif

}  // namespace metrale
