// Forced tool calls (tool_choice "required" or a named function) in every tool-call format:
// forced_tool_call_grammar's grammar compiled over a tokenizer of that format's models, walked
// by a "model" that picks uniformly among the tokens the grammar allows (a random-weight model
// is no better: only the grammar makes its reply a call). Every walk's text must parse with
// chat::ToolCallParser into one call of an allowed tool whose arguments satisfy the tool's
// schema; the markers that are one token are that token (never spelled out), and no special
// token but those markers is ever allowed.
//
// Tokenizers: Qwen3's (qwen3_coder, hermes) and DeepSeek-V3's (deepseek_v3) real ones; for
// glm45 and mistral a byte-level vocabulary with the models' markers as special added tokens,
// as GLM-4.5's and Mistral's tokenizers have them.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/tool_calls.h"
#include "grammar/grammar.h"
#include "http/openai_api.h"
#include "io/tokenizer/gzip_file.h"
#include "io/tokenizer/tokenizer.h"
#include "io/tokenizer/utf8.h"

namespace metrale::http {
namespace {

using nlohmann::json;

const json& tools() {
  static const json t = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object",
      "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "plan_trip", "parameters": {
      "type": "object",
      "properties": {
        "stops": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
          "type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "nights": {"type": "integer", "minimum": 0, "maximum": 5}},
          "required": ["name", "nights"]}},
        "budget": {"type": "number", "minimum": 0, "maximum": 1000},
        "refundable": {"type": "boolean"},
        "code": {"type": "string", "maxLength": 3}},
      "required": ["stops", "budget", "code"]}}}
  ])");
  return t;
}

size_t utf8_chars(const std::string& s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// The arguments against the two schemas above (every keyword they use).
void expect_valid(const std::string& name, const json& a, const std::string& text) {
  SCOPED_TRACE(text);
  ASSERT_TRUE(a.is_object());
  if (name == "get_weather") {
    ASSERT_TRUE(a.contains("city") && a["city"].is_string());
    const std::string city = a["city"].get<std::string>();
    EXPECT_TRUE(!city.empty() && city.size() <= 10 &&
                std::all_of(city.begin(), city.end(), [](char c) {
                  return std::isalpha(static_cast<unsigned char>(c)) || c == ' ';
                }));
    ASSERT_TRUE(a.contains("unit"));
    EXPECT_TRUE(a["unit"] == "celsius" || a["unit"] == "fahrenheit");
    if (a.contains("days")) {
      ASSERT_TRUE(a["days"].is_number_integer());
      EXPECT_GE(a["days"].get<int>(), 1);
      EXPECT_LE(a["days"].get<int>(), 7);
    }
    for (const auto& [k, v] : a.items()) EXPECT_TRUE(k == "city" || k == "unit" || k == "days");
    return;
  }
  ASSERT_EQ(name, "plan_trip");
  ASSERT_TRUE(a.contains("stops") && a["stops"].is_array());
  EXPECT_GE(a["stops"].size(), 1u);
  EXPECT_LE(a["stops"].size(), 2u);
  for (const json& s : a["stops"]) {
    ASSERT_TRUE(s.is_object());
    ASSERT_TRUE(s.contains("name") && s["name"].is_string());
    EXPECT_LE(utf8_chars(s["name"].get<std::string>()), 6u);
    ASSERT_TRUE(s.contains("nights") && s["nights"].is_number_integer());
    EXPECT_GE(s["nights"].get<int>(), 0);
    EXPECT_LE(s["nights"].get<int>(), 5);
    EXPECT_EQ(s.size(), 2u);
  }
  ASSERT_TRUE(a.contains("budget") && a["budget"].is_number());
  EXPECT_GE(a["budget"].get<double>(), 0.0);
  EXPECT_LE(a["budget"].get<double>(), 1000.0);
  if (a.contains("refundable")) {
    EXPECT_TRUE(a["refundable"].is_boolean());
  }
  ASSERT_TRUE(a.contains("code") && a["code"].is_string());
  EXPECT_LE(utf8_chars(a["code"].get<std::string>()), 3u);
  for (const auto& [k, v] : a.items())
    EXPECT_TRUE(k == "stops" || k == "budget" || k == "refundable" || k == "code") << k;
}

// A byte-level BPE vocabulary (the 256 byte symbols, no merges) plus `specials` as special
// added tokens; the first special is the eos.
Tokenizer byte_level(const std::vector<std::string>& specials) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::byte_to_utf8()[static_cast<size_t>(b)]] = b;
  json added = json::array();
  for (size_t i = 0; i < specials.size(); ++i) {
    added.push_back({{"id", 256 + static_cast<int>(i)},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  const json t = {{"version", "1.0"},
                  {"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", byte_level},
                  {"post_processor", nullptr},
                  {"decoder", byte_level},
                  {"model",
                   {{"type", "BPE"},
                    {"vocab", vocab},
                    {"merges", json::array()},
                    {"unk_token", nullptr},
                    {"byte_fallback", false}}}};
  return Tokenizer::from_json(t.dump(), "byte-level test tokenizer");
}

struct Case {
  const char* label;
  chat::ToolCallFormat format;
  const Tokenizer* tok;
  int32_t eos;
  std::vector<std::string> markers;  // the format's markers that the tokenizer has as tokens
  // The walk picks no byte token >= 0x80 (the byte-level test vocabularies): xgrammar, like
  // any byte-level grammar engine, lets bytes spell a surrogate code point (ED A0 80), which
  // decodes as U+FFFD and would miscount a string's length.
  bool ascii_bytes = false;
  chat::ToolCallSpelling spelling = chat::ToolCallSpelling::kDefault;
};

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::from_json(
      testing::read_gzip_file("tests/data/tokenizers/qwen3/tokenizer.json.gz"), "qwen3");
  return t;
}
const Tokenizer& deepseek() {
  static const Tokenizer t = Tokenizer::from_json(
      testing::read_gzip_file("tests/data/tokenizers/deepseek_v3/tokenizer.json.gz"),
      "deepseek_v3");
  return t;
}
const Tokenizer& glm_tok() {
  static const Tokenizer t =
      byte_level({"<|endoftext|>", "<|user|>", "<|assistant|>", "<tool_call>", "</tool_call>",
                  "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>", "</think>"});
  return t;
}
const Tokenizer& mistral() {
  static const Tokenizer t = byte_level(
      {"</s>", "<s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[ARGS]"});
  return t;
}

std::vector<Case> cases() {
  return {
      // (Hermes' markers are literal text around the JSON: spelled out or not.)
      {"hermes", chat::ToolCallFormat::kHermes, &qwen3(), *qwen3().token_to_id("<|im_end|>"), {}},
      {"qwen3_coder",
       chat::ToolCallFormat::kQwen3Coder,
       &qwen3(),
       *qwen3().token_to_id("<|im_end|>"),
       {"<tool_call>", "</tool_call>"}},
      {"deepseek_v3",
       chat::ToolCallFormat::kDeepSeekV3,
       &deepseek(),
       *deepseek().token_to_id("<｜end▁of▁sentence｜>"),
       {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"}},
      {"glm45",
       chat::ToolCallFormat::kGlm45,
       &glm_tok(),
       *glm_tok().token_to_id("<|endoftext|>"),
       {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"},
       true},
      {"mistral",
       chat::ToolCallFormat::kMistral,
       &mistral(),
       *mistral().token_to_id("</s>"),
       {"[TOOL_CALLS]"},
       true},
      {"mistral_v11",
       chat::ToolCallFormat::kMistral,
       &mistral(),
       *mistral().token_to_id("</s>"),
       {"[TOOL_CALLS]", "[ARGS]"},
       true,
       chat::ToolCallSpelling::kMistralArgs},
      {"deepseek_v31",
       chat::ToolCallFormat::kDeepSeekV3,
       &deepseek(),
       *deepseek().token_to_id("<｜end▁of▁sentence｜>"),
       {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"},
       false,
       chat::ToolCallSpelling::kDeepSeekV31},
  };
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

constexpr uint32_t kSeeds = 8;

bool allowed(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
}

// Walks the grammar for `choice` ("" = required) with a few seeds; every finished walk must be
// one call of an allowed tool with valid arguments.
void walk(const Case& c, const std::string& choice, const std::set<std::string>& names) {
  SCOPED_TRACE(std::string(c.label) + " tool_choice " + (choice.empty() ? "required" : choice));
  const Tokenizer& tok = *c.tok;
  static std::map<std::string, std::unique_ptr<GrammarCompiler>> compilers;
  std::unique_ptr<GrammarCompiler>& compiler = compilers[c.label];
  if (!compiler) {
    compiler = std::make_unique<GrammarCompiler>(tok, static_cast<int64_t>(tok.id_limit()),
                                                 std::vector<int32_t>{c.eos});
  }
  json chosen = json::array();
  for (const json& t : tools())
    if (names.count(t["function"]["name"].get<std::string>())) chosen.push_back(t);
  const GrammarSpec spec =
      forced_tool_call_grammar(chosen, choice, c.format, {.spelling = c.spelling});
  const auto grammar = compiler->compile(spec);
  std::set<int32_t> marker_ids, special_ids;
  for (const std::string& m : c.markers) {
    const std::optional<int32_t> id = tok.token_to_id(m);
    ASSERT_TRUE(id.has_value()) << m;
    marker_ids.insert(*id);
  }
  for (const AddedTokenInfo& a : tok.added_tokens())
    if (a.special && a.id != c.eos) special_ids.insert(a.id);
  std::set<std::string> seen;
  int whole = 0;
  for (uint32_t seed = 0; seed < kSeeds; ++seed) {
    GrammarMatcher m(grammar);
    std::vector<uint32_t> mask(m.mask_words());
    std::mt19937 rng(seed);
    std::vector<int32_t> ids;
    bool ended = false;
    for (int step = 0; step < 400 && !ended; ++step) {
      m.fill_mask(mask);
      std::vector<int32_t> ok;
      for (size_t w = 0; w < mask.size(); ++w) {
        for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
          const int32_t i = static_cast<int32_t>(w * 32) + std::countr_zero(bits);
          if (i >= static_cast<int32_t>(tok.id_limit())) break;
          if (special_ids.count(i)) {
            ASSERT_TRUE(marker_ids.count(i)) << "special token " << i << " allowed, step " << step;
          }
          if (!(c.ascii_bytes && i >= 0x80 && i < 256)) ok.push_back(i);
        }
      }
      ASSERT_FALSE(ok.empty()) << "step " << step;
      const int32_t pick = (m.completed() && allowed(mask, c.eos) && rng() % 2 == 0)
                               ? c.eos
                               : ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      ASSERT_TRUE(m.accept(pick));
      if (pick == c.eos) {
        ended = true;
      } else {
        ids.push_back(pick);
      }
    }
    if (!ended) continue;
    ++whole;
    const std::string text = tok.decode(ids, /*skip_special_tokens=*/false);
    // Each marker in the text is its token: none is spelled out by other tokens.
    for (const std::string& marker : c.markers) {
      const int32_t id = *tok.token_to_id(marker);
      EXPECT_EQ(count(text, marker), static_cast<size_t>(std::count(ids.begin(), ids.end(), id)))
          << marker << " in " << text;
    }
    const chat::ToolCallDelta d = chat::ToolCallParser::parse(c.format, text, chosen);
    EXPECT_EQ(d.content, "") << text;
    ASSERT_EQ(d.calls.size(), 1u) << text;
    EXPECT_TRUE(names.count(d.calls[0].name)) << d.calls[0].name;
    if (!choice.empty()) {
      EXPECT_EQ(d.calls[0].name, choice);
    }
    seen.insert(d.calls[0].name);
    expect_valid(d.calls[0].name, json::parse(d.calls[0].arguments), text);
  }
  EXPECT_GE(whole, kSeeds / 2) << "walks that ended";
  if (choice.empty() && names.size() > 1) {
    EXPECT_EQ(seen, names) << "every tool called once";
  }
}

// Named (of one tool and of two), and "required" of one tool and of two.
void walks(const char* label) {
  if (!grammar_available()) GTEST_SKIP() << "built without xgrammar";
  for (const Case& c : cases()) {
    if (std::string(c.label) != label) continue;
    walk(c, "get_weather", {"get_weather"});
    walk(c, "plan_trip", {"get_weather", "plan_trip"});
    walk(c, "", {"plan_trip"});
    walk(c, "", {"get_weather", "plan_trip"});
    return;
  }
  FAIL() << label;
}

TEST(ForcedToolCall, Hermes) { walks("hermes"); }
TEST(ForcedToolCall, Qwen3Coder) { walks("qwen3_coder"); }
TEST(ForcedToolCall, DeepSeekV3) { walks("deepseek_v3"); }
TEST(ForcedToolCall, Glm45) { walks("glm45"); }
TEST(ForcedToolCall, Mistral) { walks("mistral"); }
TEST(ForcedToolCall, MistralV11) { walks("mistral_v11"); }
TEST(ForcedToolCall, DeepSeekV31) { walks("deepseek_v31"); }

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ForcedToolCall, TheSpellingIsTheTemplates) {
  using S = chat::ToolCallSpelling;
  const std::string dir = "tests/data/chat_templates/";
  const std::string v3 =
      json::parse(read_text(dir + "deepseek_v3/tokenizer_config.json"))["chat_template"];
  const std::pair<std::string, S> cases[] = {
      {read_text(dir + "Mistral-Small-3.2-24B-Instruct-2506.jinja"), S::kMistralArgs},
      {read_text(dir + "mistralai-Mistral-Nemo-Instruct-2407.jinja"), S::kDefault},
      {read_text(dir + "deepseek-ai-DeepSeek-V3.1.jinja"), S::kDeepSeekV31},
      {v3, S::kDefault},
      {read_text(dir + "GLM-4.6.jinja"), S::kDefault},
  };
  for (const auto& [src, spelling] : cases) {
    const chat::ToolCallFormat f = chat::detect_tool_call_format(src);
    EXPECT_EQ(chat::detect_tool_call_spelling(f, src), spelling) << src.substr(0, 80);
  }
}

TEST(ForcedToolCall, TheMarkersAreTheTemplatesSpelling) {
  // What a call looks like in each format (the walk above checks that it parses).
  const json one = json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"s": {"type": "string"}},
                     "required": ["s"]}}}])");
  const auto text_of = [&](chat::ToolCallFormat f) {
    return forced_tool_call_grammar(one, "f", f).text;
  };
  EXPECT_NE(text_of(chat::ToolCallFormat::kQwen3Coder).find(R"("\n<function=f>\n")"),
            std::string::npos);
  EXPECT_NE(text_of(chat::ToolCallFormat::kQwen3Coder).find(R"("<parameter=s>\n")"),
            std::string::npos);
  EXPECT_NE(text_of(chat::ToolCallFormat::kDeepSeekV3).find(R"("f\n```json\n")"),
            std::string::npos);
  EXPECT_NE(
      text_of(chat::ToolCallFormat::kMistral).find(R"({"type":"token","token":"[TOOL_CALLS]"})"),
      std::string::npos);
  EXPECT_NE(text_of(chat::ToolCallFormat::kGlm45).find(R"({"type":"token","token":"<arg_value>"})"),
            std::string::npos);
  for (auto f : {chat::ToolCallFormat::kQwen3Coder, chat::ToolCallFormat::kGlm45,
                 chat::ToolCallFormat::kDeepSeekV3, chat::ToolCallFormat::kMistral}) {
    EXPECT_EQ(forced_tool_call_grammar(one, "f", f).kind, GrammarSpec::Kind::kStructuralTag);
  }
}

// Feeds `text` (tokenized as the tokenizer does, markers as their tokens) to the grammar:
// whether every token is accepted and the whole is a complete match.
// With `spelled`, the text between each pair of \x01 bytes is a marker spelled out by ordinary
// tokens (each of its characters tokenized alone), as a model writing it inside a string would.
bool accepts(const Case& c, const json& tools, const std::string& text,
             bool reasoning_open = false) {
  GrammarCompiler compiler(*c.tok, static_cast<int64_t>(c.tok->id_limit()), {c.eos});
  GrammarMatcher m(compiler.compile(
      forced_tool_call_grammar(tools, "", c.format, {.reasoning_open = reasoning_open})));
  std::vector<int32_t> ids;
  size_t at = 0;
  for (bool spelled = false; at <= text.size(); spelled = !spelled) {
    const size_t next = std::min(text.find('\x01', at), text.size());
    const std::string piece = text.substr(at, next - at);
    if (spelled) {
      for (char ch : piece) {
        for (int32_t id : c.tok->encode(std::string(1, ch), false)) ids.push_back(id);
      }
    } else {
      for (int32_t id : c.tok->encode(piece, false)) ids.push_back(id);
    }
    at = next + 1;
  }
  for (int32_t id : ids)
    if (!m.accept(id)) return false;
  return m.completed();
}

// `text` with the \x01 marks of accepts() taken out.
std::string unmarked(std::string text) {
  std::erase(text, '\x01');
  return text;
}

TEST(ForcedToolCall, FreeStringsRunToTheirEndMarker) {
  if (!grammar_available()) GTEST_SKIP() << "built without xgrammar";
  // A string parameter without constraints is any text up to the end marker, never holding
  // one (the parser would end the value there).
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "note",
      "parameters": {"type": "object", "properties": {"body": {"type": "string"},
                     "n": {"type": "integer"}}, "required": ["body"]}}}])");
  const Case qwen = cases()[1], glm = cases()[3];
  ASSERT_EQ(std::string(qwen.label), "qwen3_coder");
  ASSERT_EQ(std::string(glm.label), "glm45");
  const std::string q = "<tool_call>\n<function=note>\n<parameter=body>\n";
  EXPECT_TRUE(
      accepts(qwen, tools, q + "if a < b:\n  x = {1}\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(accepts(qwen, tools,
                      q + "x\n</parameter>\n<parameter=n>\n42\n</parameter>\n"
                          "</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(qwen, tools, q + "a</parameter>b\n</parameter>\n</function>\n</tool_call>"));
  const std::string g = "<tool_call>note\n<arg_key>body</arg_key>\n<arg_value>";
  EXPECT_TRUE(accepts(glm, tools, g + "if a < b: {x}</arg_value>\n</tool_call>"));
  EXPECT_TRUE(accepts(glm, tools,
                      g + "x</arg_value>\n<arg_key>n</arg_key>\n<arg_value>7"
                          "</arg_value>\n</tool_call>"));
  // The raw value may not hold a marker: spelled out, or as its special token; inside it the
  // only special token allowed is the one that ends it.
  EXPECT_FALSE(accepts(glm, tools, g + "a<arg_key>b</arg_value>\n</tool_call>"));
  GrammarCompiler compiler(glm_tok(), static_cast<int64_t>(glm_tok().id_limit()), {glm.eos});
  GrammarMatcher m(compiler.compile(forced_tool_call_grammar(tools, "note", glm.format)));
  for (int32_t id : glm_tok().encode(g + "ab", false)) ASSERT_TRUE(m.accept(id));
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_mask(mask);
  for (const AddedTokenInfo& a : glm_tok().added_tokens()) {
    EXPECT_EQ(allowed(mask, a.id), a.content == "</arg_value>") << a.content;
  }
  const chat::ToolCallDelta d = chat::ToolCallParser::parse(
      chat::ToolCallFormat::kGlm45, g + "if a < b: {x}</arg_value>\n</tool_call>", tools);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(json::parse(d.calls[0].arguments), json::parse(R"({"body": "if a < b: {x}"})"));
}

TEST(ForcedToolCall, NoValueEndsTheCallEarly) {
  if (!grammar_available()) GTEST_SKIP() << "built without xgrammar";
  // A JSON value's strings may spell any marker; the grammar lets them, and the parser reads
  // past them. A pattern's raw string never writes '<' (so never a marker), even where the
  // pattern would allow one; a pattern that needs '<' is refused, naming it.
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "note",
      "parameters": {"type": "object", "properties": {"body": {"type": "string",
                     "pattern": "^.{1,40}$"}, "meta": {"type": "object"},
                     "tags": {"type": "array", "items": {"type": "string"}}},
                     "required": ["body"]}}}])");
  const Case hermes = cases()[0], qwen = cases()[1], glm = cases()[3];
  ASSERT_EQ(std::string(qwen.label), "qwen3_coder");
  ASSERT_EQ(std::string(glm.label), "glm45");
  const std::string q =
      "<tool_call>\n<function=note>\n<parameter=body>\nhi\n</parameter>\n<parameter=meta>\n"
      "{\"html\": \"</parameter>\\n</function>\\n</tool_call>\"}\n</parameter>\n"
      "</function>\n</tool_call>";
  const std::string g =
      "<tool_call>note\n<arg_key>body</arg_key>\n<arg_value>hi</arg_value>\n<arg_key>tags"
      "</arg_key>\n<arg_value>[\"\x01</arg_value>\x01\",\"\x01</tool_call>\x01\"]</arg_value>\n"
      "</tool_call>";
  const std::string h =
      "<tool_call>\n{\"name\":\"note\",\"arguments\":{\"body\":\"a \x01</tool_call>\x01 b\"}}\n"
      "</tool_call>";
  for (const auto& [c, text, args] :
       {std::tuple{qwen, q,
                   R"({"body":"hi","meta":{"html":"</parameter>\n</function>\n</tool_call>"}})"},
        std::tuple{glm, g, R"({"body":"hi","tags":["</arg_value>","</tool_call>"]})"},
        std::tuple{hermes, h, R"({"body":"a </tool_call> b"})"}}) {
    SCOPED_TRACE(c.label);
    EXPECT_TRUE(accepts(c, tools, text)) << text;
    const chat::ToolCallDelta d = chat::ToolCallParser::parse(c.format, unmarked(text), tools);
    EXPECT_EQ(d.content, "");
    ASSERT_EQ(d.calls.size(), 1u) << text;
    EXPECT_EQ(json::parse(d.calls[0].arguments), json::parse(args));
  }
  const std::string raw = "<tool_call>\n<function=note>\n<parameter=body>\n";
  EXPECT_TRUE(accepts(qwen, tools, raw + "a b\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(
      accepts(qwen, tools, raw + "a</parameter>\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(qwen, tools, raw + "a < b\n</parameter>\n</function>\n</tool_call>"));
  const json needs_lt = json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"d": {"type": "string",
                     "pattern": "^<[a-z]+>$"}}}}}])");
  try {
    forced_tool_call_grammar(needs_lt, "f", qwen.format);
    ADD_FAILURE() << "a pattern that writes '<' was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("'pattern' at '#/properties/d'"), std::string::npos)
        << e.what();
  }
}

TEST(ForcedToolCall, AfterAnOpenThinkBlock) {
  if (!grammar_available()) GTEST_SKIP() << "built without xgrammar";
  // A prompt that leaves the reply inside <think> (Qwen3.5's): the reasoning is free text up
  // to </think>, then the call; without it the call starts at once.
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                     "required": ["n"]}}}])");
  const std::string call =
      "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n"
      "</function>\n</tool_call>";
  const Case qwen = cases()[1];
  EXPECT_TRUE(accepts(qwen, tools, "Let me <b>check</b>.\n</think>\n\n" + call, true));
  EXPECT_TRUE(accepts(qwen, tools, "</think>" + call, true));
  EXPECT_FALSE(accepts(qwen, tools, call, true));
  EXPECT_FALSE(accepts(qwen, tools, "Hm.\n</think>\n\nSure: " + call, true));
  EXPECT_FALSE(accepts(qwen, tools, "Hm.\n</think>\n\n" + call, false));
  const Case hermes = cases()[0];
  EXPECT_TRUE(accepts(hermes, tools,
                      "Hm.</think>\n\n<tool_call>\n{\"name\":\"f\",\"arguments\":"
                      "{\"n\":5}}\n</tool_call>",
                      true));
  // GLM's </think> is a special token: it ends the reasoning as that token.
  const Case glm = cases()[3];
  EXPECT_TRUE(accepts(glm, tools,
                      "Hm.</think><tool_call>f\n<arg_key>n</arg_key>\n<arg_value>5"
                      "</arg_value>\n</tool_call>",
                      true));
}

TEST(ForcedToolCall, RefusalsNameToolChoice) {
  const auto refused = [](const json& tools, const std::string& name, chat::ToolCallFormat f,
                          const std::string& words) {
    try {
      forced_tool_call_grammar(tools, name, f);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "tool_choice");
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  for (auto f : {chat::ToolCallFormat::kHermes, chat::ToolCallFormat::kQwen3Coder,
                 chat::ToolCallFormat::kGlm45, chat::ToolCallFormat::kDeepSeekV3,
                 chat::ToolCallFormat::kMistral, chat::ToolCallFormat::kLlama3Json}) {
    refused(tools(), "nope", f, "no tool is named \"nope\"");
  }
  refused(tools(), "get_weather", chat::ToolCallFormat::kNone, "not supported for the none");
  // glm45 writes string values raw: a format it cannot constrain there is refused, named.
  const json formatted = json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"d": {"type": "string",
                     "format": "date"}}}}}])");
  refused(formatted, "f", chat::ToolCallFormat::kGlm45, "'format'");
  const json negated = json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"d": {"type": "string",
                     "not": {"const": "x"}}}}}}])");
  refused(negated, "f", chat::ToolCallFormat::kGlm45, "'not'");
}

TEST(ForcedToolCall, UnsupportedKeywordsAreRefusedAtCompile) {
  if (!grammar_available()) GTEST_SKIP() << "built without xgrammar";
  // A keyword the engine would ignore, inside a structural tag's JSON schema: an error naming
  // the field and the keyword, never an unconstrained reply.
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"n": {"type": "array",
                     "uniqueItems": true}}}}}])");
  GrammarCompiler compiler(mistral(), static_cast<int64_t>(mistral().id_limit()),
                           {*mistral().token_to_id("</s>")});
  for (auto f : {chat::ToolCallFormat::kQwen3Coder, chat::ToolCallFormat::kGlm45,
                 chat::ToolCallFormat::kDeepSeekV3, chat::ToolCallFormat::kMistral}) {
    try {
      compiler.compile(forced_tool_call_grammar(tools, "f", f));
      ADD_FAILURE() << chat::tool_call_format_name(f);
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("tool_choice"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("uniqueItems"), std::string::npos) << e.message();
    }
  }
}

}  // namespace
}  // namespace metrale::http
