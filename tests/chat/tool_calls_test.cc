// Tool-call parsers (chat/tool_calls.h): every format on single, parallel, malformed and
// unterminated calls; the streaming property (any split of the text into feed() calls gives
// what parsing it whole gives); prompt release of content; format detection on every committed
// template; and the tool-call turns transformers rendered with the real templates
// (tests/data/chat_templates/fixtures.json) parsed back into the request's calls.
#include "chat/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace metrale::chat {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using F = ToolCallFormat;

const std::string kDir = "tests/data/chat_templates/";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The tools of the fixtures' requests (get_weather: city string, days integer; search: query
// string), plus a parameter typed by a list holding only "string".
const json& weather_tools() {
  static const json kTools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                     "zip": {"type": ["string"]}, "flags": {"type": ["string", "null"]}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
      "properties": {"query": {"type": "string"}}}}}])");
  return kTools;
}

ToolCall call(std::string name, std::string arguments, std::string id = "") {
  return ToolCall{std::move(name), std::move(arguments), std::move(id)};
}

struct Case {
  const char* label;
  F format;
  std::string text;
  std::string content;
  std::vector<ToolCall> calls;
  bool with_tools = false;
};

// DeepSeek's markers, as the templates write them.
const std::string kB = "<｜tool▁calls▁begin｜>";
const std::string kE = "<｜tool▁calls▁end｜>";
const std::string kCb = "<｜tool▁call▁begin｜>";
const std::string kCe = "<｜tool▁call▁end｜>";
const std::string kSep = "<｜tool▁sep｜>";

std::string deep_json(int depth) {
  return "{\"name\": \"f\", \"arguments\": {\"x\": " + std::string(depth, '[') +
         std::string(depth, ']') + "}}";
}

std::vector<Case> cases() {
  // Call texts shaped as the templates in tests/data/chat_templates render them.
  const std::string qwen_call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n"
      "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
  const std::string qwen_search =
      "<tool_call>\n<function=search>\n<parameter=query>\nZürich news\n</parameter>\n"
      "<parameter=limit>\n[1, 2.5, null, true]\n</parameter>\n</function>\n</tool_call>";
  const std::string glm_call =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
  const std::string v3_call = kCb + "function" + kSep +
                              "get_weather\n```json\n{\"city\": \"Zürich\", \"days\": 2}\n```" +
                              kCe;
  const std::string v31_call =
      kCb + "get_weather" + kSep + "{\"city\": \"Zürich\", \"days\": 2}" + kCe;
  const std::string v31_search =
      kCb + "search" + kSep + "{\"query\": \"Zürich news\", \"limit\": [1, 2.5, null, true]}" + kCe;
  const std::string weather_args = R"({"city":"Zürich","days":2})";
  const std::string search_args = R"({"query":"Zürich news","limit":[1,2.5,null,true]})";

  return {
      // hermes
      {"hermes single",
       F::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": "
       "2}}\n</tool_call>",
       "",
       {call("get_weather", weather_args)}},
      {"hermes parallel, content before, whitespace after",
       F::kHermes,
       "Checking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Zürich\", "
       "\"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
       "{\"query\": "
       "\"Zürich news\", \"limit\": [1, 2.5, null, true]}}\n</tool_call>\n  \n",
       "Checking both.\n",
       {call("get_weather", weather_args), call("search", search_args)}},
      {"hermes text after",
       F::kHermes,
       "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n Done.",
       "\n Done.",
       {call("f", "{}")}},
      {"hermes text between",
       F::kHermes,
       "<tool_call>{\"name\": \"a\"}</tool_call> and <tool_call>{\"name\": \"b\", \"arguments\": "
       "{\"k\": "
       "\"v\"}}</tool_call>",
       " and ",
       {call("a", "{}"), call("b", R"({"k":"v"})")}},
      {"hermes key order kept",
       F::kHermes,
       "<tool_call>{\"name\": \"f\", \"arguments\": {\"z\": 1, \"a\": {\"y\": 2, \"b\": "
       "3}}}</tool_call>",
       "",
       {call("f", R"({"z":1,"a":{"y":2,"b":3}})")}},
      {"hermes arguments as a JSON string",
       F::kHermes,
       "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
       "",
       {call("f", R"({"a":1})")}},
      {"hermes arguments not an object",
       F::kHermes,
       "A <tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call> B",
       "A <tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call> B",
       {}},
      {"hermes bad JSON then a good call",
       F::kHermes,
       "<tool_call>{\"name\": \"f\", </tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": "
       "{}}</tool_call>",
       "<tool_call>{\"name\": \"f\", </tool_call>\n",
       {call("g", "{}")}},
      {"hermes no name",
       F::kHermes,
       "<tool_call>{\"arguments\": {}}</tool_call>",
       "<tool_call>{\"arguments\": {}}</tool_call>",
       {}},
      {"hermes unterminated, complete",
       F::kHermes,
       "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n",
       "Hi ",
       {call("f", R"({"x":1})")}},
      {"hermes cut inside the end marker",
       F::kHermes,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_c",
       "",
       {call("f", R"({"x":1})")}},
      {"hermes unterminated, incomplete",
       F::kHermes,
       "<tool_call>\n{\"name\": \"f\", \"argu",
       "<tool_call>\n{\"name\": \"f\", \"argu",
       {}},
      {"hermes unicode and escapes",
       F::kHermes,
       "<tool_call>{\"name\": \"say\", \"arguments\": {\"text\": \"Zürich ☀ 日本 \\u00e9 "
       "\\\"q\\\"\"}}</tool_call>",
       "",
       {call("say", R"({"text":"Zürich ☀ 日本 é \"q\""})")}},
      {"hermes nesting too deep is content",
       F::kHermes,
       "<tool_call>" + deep_json(100) + "</tool_call>",
       "<tool_call>" + deep_json(100) + "</tool_call>",
       {}},
      {"hermes nesting within the limit",
       F::kHermes,
       "<tool_call>" + deep_json(40) + "</tool_call>",
       "",
       {call("f", "{\"x\":" + std::string(40, '[') + std::string(40, ']') + "}")}},
      {"hermes marker prefix at the end", F::kHermes, "Hi <tool_ca", "Hi <tool_ca", {}},
      {"hermes plain text",
       F::kHermes,
       "Just <b>text</b> < tool_call >.",
       "Just <b>text</b> < tool_call >.",
       {}},

      // qwen3_coder
      {"qwen3_coder single",
       F::kQwen3Coder,
       qwen_call,
       "",
       {call("get_weather", weather_args)},
       true},
      {"qwen3_coder parallel, content before",
       F::kQwen3Coder,
       "Checking both.\n\n" + qwen_call + "\n" + qwen_search + "\n",
       "Checking both.\n\n",
       {call("get_weather", weather_args), call("search", search_args)},
       true},
      {"qwen3_coder string vs typed values",
       F::kQwen3Coder,
       "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</"
       "parameter>\n<parameter=days>\n3\n"
       "</parameter>\n<parameter=zip>\n08001\n</parameter>\n<parameter=flags>\nnull\n</parameter>\n"
       "<parameter=note>\nline 1\nline 2\n</parameter>\n<parameter=opts>\n{\"a\": [true, "
       "1.5]}\n</parameter>\n"
       "</function>\n</tool_call>",
       "",
       {call(
           "get_weather",
           R"({"city":"123","days":3,"zip":"08001","flags":null,"note":"line 1\nline 2","opts":{"a":[true,1.5]}})")},
       true},
      {"qwen3_coder without tools: JSON where it parses",
       F::kQwen3Coder,
       "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</"
       "parameter>\n<parameter=days>\n"
       "two\n</parameter>\n<parameter=x>\n\n padded \n\n</parameter>\n</function>\n</tool_call>",
       "",
       {call("get_weather", R"({"city":123,"days":"two","x":"\n padded \n"})")}},
      // A JSON value's strings may spell any marker (a forced call's grammar lets them): the
      // value ends at the first end marker outside them.
      {"qwen3_coder JSON value spelling the markers",
       F::kQwen3Coder,
       "<tool_call>\n<function=get_weather>\n<parameter=opts>\n{\"html\": "
       "\"</parameter>\\n</function>\\n</tool_call>\"}\n</parameter>\n<parameter=city>\n"
       "Bern\n</parameter>\n</function>\n</tool_call> ok",
       " ok",
       {call("get_weather",
             R"({"opts":{"html":"</parameter>\n</function>\n</tool_call>"},"city":"Bern"})")},
       true},
      {"glm45 JSON value spelling the markers",
       F::kGlm45,
       "<tool_call>get_weather\n<arg_key>opts</arg_key>\n<arg_value>[\"</arg_value>\", "
       "\"</tool_call>\"]</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n"
       "</tool_call> ok",
       " ok",
       {call("get_weather", R"({"opts":["</arg_value>","</tool_call>"],"days":2})")},
       true},
      {"hermes JSON string spelling the end marker",
       F::kHermes,
       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a </tool_call> "
       "b\"}}\n</tool_call> done",
       " done",
       {call("search", R"({"query":"a </tool_call> b"})")}},
      {"qwen3_coder no parameters",
       F::kQwen3Coder,
       "<tool_call>\n<function=now>\n</function>\n</tool_call>",
       "",
       {call("now", "{}")}},
      {"qwen3_coder malformed (no </parameter>)",
       F::kQwen3Coder,
       "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call> after",
       "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call> after",
       {}},
      {"qwen3_coder unterminated, complete",
       F::kQwen3Coder,
       "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n",
       "",
       {call("f", R"({"x":1})")}},
      {"qwen3_coder unterminated, incomplete",
       F::kQwen3Coder,
       "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n",
       "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n",
       {}},
      {"qwen3_coder unicode",
       F::kQwen3Coder,
       "<tool_call>\n<function=say>\n<parameter=text>\n日本語 ☀ "
       "\"quoted\"\n</parameter>\n</function>\n</tool_call>",
       "",
       {call("say", R"({"text":"日本語 ☀ \"quoted\""})")}},

      // glm45
      {"glm45 single (GLM-4.6 layout)",
       F::kGlm45,
       glm_call,
       "",
       {call("get_weather", weather_args)},
       true},
      {"glm45 parallel, content before (GLM-4.7 layout)",
       F::kGlm45,
       "Checking "
       "both.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich</"
       "arg_value><arg_key>days"
       "</arg_key><arg_value>2</arg_value></tool_call><tool_call>search<arg_key>query</"
       "arg_key><arg_value>"
       "Zürich news</arg_value><arg_key>limit</arg_key><arg_value>[1, 2.5, null, "
       "true]</arg_value></tool_call>",
       "Checking both.",
       {call("get_weather", weather_args), call("search", search_args)},
       true},
      {"glm45 string vs typed values",
       F::kGlm45,
       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>\n42\n</arg_value><arg_key>days</"
       "arg_key>"
       "<arg_value>5</arg_value><arg_key>extra</arg_key><arg_value>true</arg_value></tool_call>",
       "",
       {call("get_weather", R"({"city":"42","days":5,"extra":true})")},
       true},
      {"glm45 no arguments", F::kGlm45, "<tool_call>now</tool_call>", "", {call("now", "{}")}},
      {"glm45 malformed",
       F::kGlm45,
       "<tool_call>f<arg_key>x</arg_key>oops</tool_call>\nok",
       "<tool_call>f<arg_key>x</arg_key>oops</tool_call>\nok",
       {}},
      {"glm45 unterminated, complete",
       F::kGlm45,
       "<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value>\n",
       "",
       {call("f", R"({"x":1})")}},
      {"glm45 unterminated, incomplete",
       F::kGlm45,
       "<tool_call>f<arg_key>x</arg_key><arg_va",
       "<tool_call>f<arg_key>x</arg_key><arg_va",
       {}},
      {"glm45 unterminated name only", F::kGlm45, "<tool_call>get_wea", "<tool_call>get_wea", {}},

      // deepseek_v3 (V3 as the deepseek_v3 tokenizer_config template writes calls, V3.1 as
      // deepseek-ai-DeepSeek-V3.1.jinja does)
      {"deepseek V3 single",
       F::kDeepSeekV3,
       kB + v3_call + kE,
       "",
       {call("get_weather", weather_args)}},
      {"deepseek V3 parallel",
       F::kDeepSeekV3,
       kB + v3_call + "\n" + kCb + "function" + kSep + "search\n```json\n{\"query\": \"x\"}\n```" +
           kCe + kE,
       "",
       {call("get_weather", weather_args), call("search", R"({"query":"x"})")}},
      {"deepseek V3.1 parallel, content before, text after",
       F::kDeepSeekV3,
       "Checking both." + kB + v31_call + v31_search + kE + " Done.",
       "Checking both. Done.",
       {call("get_weather", weather_args), call("search", search_args)}},
      {"deepseek malformed block kept whole",
       F::kDeepSeekV3,
       "x" + kB + kCb + "f" + kSep + "{bad}" + kCe + kE + "y",
       "x" + kB + kCb + "f" + kSep + "{bad}" + kCe + kE + "y",
       {}},
      {"deepseek malformed then good",
       F::kDeepSeekV3,
       kB + kCb + "nosep" + kCe + v31_call + kE,
       kB + kCb + "nosep" + kCe,
       {call("get_weather", weather_args)}},
      {"deepseek unterminated, complete",
       F::kDeepSeekV3,
       kB + kCb + "f" + kSep + "{\"a\": 1}",
       "",
       {call("f", R"({"a":1})")}},
      {"deepseek call closed by the block's end",
       F::kDeepSeekV3,
       kB + kCb + "f" + kSep + "{\"a\": 1}" + kE,
       "",
       {call("f", R"({"a":1})")}},
      {"deepseek cut inside the end marker",
       F::kDeepSeekV3,
       kB + kCb + "f" + kSep + "{\"a\": 1}<｜tool▁ca",
       "",
       {call("f", R"({"a":1})")}},
      {"deepseek unterminated, incomplete",
       F::kDeepSeekV3,
       kB + kCb + "f" + kSep + "{\"a\": ",
       kB + kCb + "f" + kSep + "{\"a\": ",
       {}},
      {"deepseek V3 unterminated without closing fence",
       F::kDeepSeekV3,
       kB + kCb + "function" + kSep + "f\n```json\n{\"a\": \"ü\"}\n",
       "",
       {call("f", R"({"a":"ü"})")}},

      // mistral (Nemo as mistralai-Mistral-Nemo-Instruct-2407.jinja writes calls; v11 as
      // Mistral-Small-3.2-24B-Instruct-2506.jinja does)
      {"mistral nemo single",
       F::kMistral,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": "
       "2}, \"id\": "
       "\"call12345\"}]",
       "",
       {call("get_weather", weather_args, "call12345")}},
      {"mistral nemo parallel, content before",
       F::kMistral,
       "Sure. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": "
       "{\"x\": "
       "[1]}}]\n",
       "Sure. ",
       {call("a", "{}"), call("b", R"({"x":[1]})")}},
      {"mistral nemo malformed",
       F::kMistral,
       "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {]",
       "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {]",
       {}},
      {"mistral v11 with call ids",
       F::kMistral,
       "[TOOL_CALLS]get_weather[CALL_ID]call12345[ARGS]{\"city\": \"Zürich\", \"days\": "
       "2}[TOOL_CALLS]search"
       "[CALL_ID]call67890[ARGS]{\"query\": \"Zürich news\", \"limit\": [1, 2.5, null, true]}",
       "",
       {call("get_weather", weather_args, "call12345"), call("search", search_args, "call67890")}},
      {"mistral v11 without call id, text after",
       F::kMistral,
       "Hi [TOOL_CALLS]f[ARGS]{\"a\": 1} done",
       "Hi  done",
       {call("f", R"({"a":1})")}},
      {"mistral v11 malformed",
       F::kMistral,
       "[TOOL_CALLS]f[ARGS]{bad",
       "[TOOL_CALLS]f[ARGS]{bad",
       {}},
      {"mistral v11 one of two malformed",
       F::kMistral,
       "[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]",
       "[TOOL_CALLS]g[ARGS]",
       {call("f", R"({"a":1})")}},

      // llama3_json (as the meta-llama-Llama-3.x templates write a call)
      {"llama single",
       F::kLlama3Json,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\", "
       "\"days\": 2}}",
       "",
       {call("get_weather", weather_args)}},
      {"llama python tag, arguments key",
       F::kLlama3Json,
       "\n <|python_tag|>{\"name\": \"f\", \"arguments\": {\"q\": \"日本\"}}\n",
       "",
       {call("f", R"({"q":"日本"})")}},
      {"llama several joined by ;",
       F::kLlama3Json,
       "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}",
       "",
       {call("a", "{}"), call("b", R"({"x":1})")}},
      {"llama text after",
       F::kLlama3Json,
       "{\"name\": \"a\", \"parameters\": {}} That is all.",
       "That is all.",
       {call("a", "{}")}},
      {"llama not a candidate",
       F::kLlama3Json,
       "The call is {\"name\": \"a\", \"parameters\": {}}",
       "The call is {\"name\": \"a\", \"parameters\": {}}",
       {}},
      {"llama malformed candidate",
       F::kLlama3Json,
       "  {\"not\": \"a call\"}",
       "  {\"not\": \"a call\"}",
       {}},
      {"llama incomplete",
       F::kLlama3Json,
       "{\"name\": \"a\", \"parameters\": {\"x\": ",
       "{\"name\": \"a\", \"parameters\": {\"x\": ",
       {}},
      {"llama tag prefix only", F::kLlama3Json, "<|pyth", "<|pyth", {}},
      {"llama whitespace only", F::kLlama3Json, " \n", " \n", {}},

      {"none",
       F::kNone,
       "<tool_call>{\"name\": \"f\"}</tool_call>",
       "<tool_call>{\"name\": \"f\"}</tool_call>",
       {}},
  };
}

// Feeds `pieces` then finishes, concatenating every delta.
ToolCallDelta feed_all(const Case& c, const std::vector<std::string_view>& pieces) {
  ToolCallParser p(c.format, c.with_tools ? weather_tools() : json());
  ToolCallDelta all;
  const auto add = [&](ToolCallDelta d) {
    all.content += d.content;
    for (ToolCall& x : d.calls) all.calls.push_back(std::move(x));
  };
  for (std::string_view piece : pieces) add(p.feed(piece));
  add(p.finish());
  EXPECT_EQ(p.calls_seen(), static_cast<int64_t>(all.calls.size()));
  return all;
}

std::string show(const std::vector<ToolCall>& calls) {
  std::string s;
  for (const ToolCall& c : calls) s += c.name + " " + c.arguments + " id=" + c.id + "\n";
  return s;
}

TEST(ToolCallParser, ParsesEveryCase) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    const ToolCallDelta d =
        ToolCallParser::parse(c.format, c.text, c.with_tools ? weather_tools() : json());
    EXPECT_EQ(d.content, c.content);
    EXPECT_EQ(show(d.calls), show(c.calls));
  }
}

TEST(ToolCallParser, AnySplitGivesTheWholeParse) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    const ToolCallDelta whole = feed_all(c, {c.text});
    const std::string_view t = c.text;
    for (size_t i = 0; i <= t.size(); ++i) {
      const ToolCallDelta split = feed_all(c, {t.substr(0, i), t.substr(i)});
      ASSERT_EQ(split.content, whole.content) << "split at " << i;
      ASSERT_EQ(split.calls, whole.calls) << "split at " << i;
    }
    std::vector<std::string_view> bytes;
    for (size_t i = 0; i < t.size(); ++i) bytes.push_back(t.substr(i, 1));
    const ToolCallDelta one_by_one = feed_all(c, bytes);
    EXPECT_EQ(one_by_one.content, whole.content);
    EXPECT_EQ(one_by_one.calls, whole.calls);
  }
}

TEST(ToolCallParser, ReleasesContentPromptly) {
  {
    ToolCallParser p(F::kHermes);
    EXPECT_EQ(p.feed("Hello <tool").content, "Hello ");  // only the possible marker is held
    EXPECT_EQ(p.feed("box>").content, "<toolbox>");
    const ToolCallDelta d = p.feed("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
    ASSERT_EQ(d.calls.size(), 1u);  // the call comes out as soon as its end is seen
    EXPECT_EQ(d.calls[0].name, "f");
    EXPECT_TRUE(p.feed("\n").empty());        // whitespace after a call is held...
    EXPECT_EQ(p.feed("ok").content, "\nok");  // ...and released with the text that follows
    EXPECT_TRUE(p.finish().empty());
  }
  {
    ToolCallParser p(F::kDeepSeekV3);
    EXPECT_EQ(p.feed("Hi <｜tool").content, "Hi ");
    const ToolCallDelta d = p.feed("▁calls▁begin｜>" + kCb + "f" + kSep + "{}" + kCe);
    ASSERT_EQ(d.calls.size(), 1u);  // each call as its end is seen, before the block closes
    EXPECT_TRUE(p.feed(kCb + "g" + kSep + "{\"a\": 1}").empty());
    EXPECT_EQ(p.feed(kCe).calls.size(), 1u);
    EXPECT_TRUE(p.feed(kE).empty());
    EXPECT_TRUE(p.finish().empty());
  }
  {
    ToolCallParser p(F::kMistral);
    EXPECT_EQ(p.feed("Sure [TOOL").content, "Sure ");
    EXPECT_TRUE(p.feed("_CALLS]f[ARGS]{}").empty());  // the calls run to the end of the text
    EXPECT_EQ(p.finish().calls.size(), 1u);
  }
  {
    ToolCallParser p(F::kLlama3Json);
    EXPECT_TRUE(p.feed("  ").empty());
    EXPECT_EQ(p.feed("Hello").content, "  Hello");  // not a call: content from here on
    EXPECT_EQ(p.feed(" {").content, " {");
  }
  {
    ToolCallParser p(F::kLlama3Json);
    EXPECT_TRUE(p.feed("{\"name\": \"f\", \"parameters\": {}}").empty());  // held to the end
    EXPECT_EQ(p.finish().calls.size(), 1u);
  }
}

TEST(ToolCallParser, DetectsTheFormatOfEveryCommittedTemplate) {
  const std::vector<std::pair<std::string, F>> files = {
      {"GLM-4.6.jinja", F::kGlm45},
      {"GLM-4.7-Flash.jinja", F::kGlm45},
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", F::kMistral},
      {"Qwen3-Coder.jinja", F::kQwen3Coder},
      {"Qwen3.5-4B.jinja", F::kQwen3Coder},
      {"deepseek-ai-DeepSeek-V3.1.jinja", F::kDeepSeekV3},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", F::kLlama3Json},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", F::kLlama3Json},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", F::kLlama3Json},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", F::kMistral},
  };
  for (const auto& [file, format] : files) {
    EXPECT_EQ(tool_call_format_name(detect_tool_call_format(read_text(kDir + file))),
              tool_call_format_name(format))
        << file;
  }
  const std::vector<std::pair<std::string, F>> configs = {{"qwen3", F::kHermes},
                                                          {"deepseek_v3", F::kDeepSeekV3}};
  for (const auto& [dir, format] : configs) {
    const json config = json::parse(read_text(kDir + dir + "/tokenizer_config.json"));
    EXPECT_EQ(
        tool_call_format_name(detect_tool_call_format(config["chat_template"].get<std::string>())),
        tool_call_format_name(format))
        << dir;
  }
  EXPECT_EQ(detect_tool_call_format("{% for m in messages %}{{ m.content }}{% endfor %}"),
            F::kNone);
}

TEST(ToolCallParser, FormatNames) {
  for (F f : {F::kNone, F::kHermes, F::kQwen3Coder, F::kGlm45, F::kDeepSeekV3, F::kMistral,
              F::kLlama3Json}) {
    EXPECT_EQ(tool_call_format_from_name(tool_call_format_name(f)), f);
  }
  EXPECT_EQ(tool_call_format_name(F::kQwen3Coder), "qwen3_coder");
  const std::string e = test::error_of([] { tool_call_format_from_name("hermes2"); });
  EXPECT_NE(e.find("hermes2"), std::string::npos) << e;
  EXPECT_NE(e.find("llama3_json"), std::string::npos) << e;
  EXPECT_TRUE(tool_call_markers_are_special(F::kMistral));
  EXPECT_TRUE(tool_call_markers_are_special(F::kLlama3Json));
  EXPECT_FALSE(tool_call_markers_are_special(F::kHermes));
}

// The assistant turns with tool calls that transformers rendered with each real template
// (fixtures.json): the text between the turn's opening and its end-of-turn marker is what the
// model would have written; parsing it must give back the request's calls.
TEST(ToolCallParser, RecoversTheCallsTheRealTemplatesRender) {
  struct Turn {
    std::string template_id;
    std::string conversation;
    std::string question;  // the user's message just before the turn
    std::string open;      // where the assistant's text starts
    std::string close;     // where it ends
    F format;
    std::string content;  // the turn's content, trimmed
  };
  const std::string kQuestion2 = "Weather in Zürich and news about it?";
  const std::string kQuestion1 = "Weather in Zürich?";
  const std::vector<Turn> turns = {
      {"qwen3", "parallel_tools", kQuestion2, "<|im_start|>assistant\n", "<|im_end|>", F::kHermes,
       "Checking both."},
      {"qwen3.5", "parallel_tools", kQuestion2, "<|im_start|>assistant\n", "<|im_end|>",
       F::kQwen3Coder, "Checking both."},
      {"qwen3_coder", "parallel_tools", kQuestion2, "<|im_start|>assistant\n", "<|im_end|>",
       F::kQwen3Coder, "Checking both."},
      {"glm4.6", "parallel_tools", kQuestion2, "<|assistant|>\n<think></think>\n",
       "<|observation|>", F::kGlm45, "Checking both."},
      {"glm4.7_flash", "parallel_tools", kQuestion2, "<|assistant|></think>", "<|observation|>",
       F::kGlm45, "Checking both."},
      {"deepseek_v3.1", "parallel_tools", kQuestion2, "<｜Assistant｜><think></think>",
       "<｜end▁of▁sentence｜>", F::kDeepSeekV3, "Checking both."},
      {"mistral_nemo", "parallel_tools", kQuestion2, "[/INST]", "</s>", F::kMistral, ""},
      {"mistral_small3.2", "parallel_tools", kQuestion2, "[/INST]", "</s>", F::kMistral, ""},
      {"llama3.1", "tool_round", kQuestion1, "<|start_header_id|>assistant<|end_header_id|>\n\n",
       "<|eot_id|>", F::kLlama3Json, ""},
      {"llama3.2", "tool_round", kQuestion1, "<|start_header_id|>assistant<|end_header_id|>\n\n",
       "<|eot_id|>", F::kLlama3Json, ""},
      {"llama3.3", "tool_round", kQuestion1, "<|start_header_id|>assistant<|end_header_id|>\n\n",
       "<|eot_id|>", F::kLlama3Json, ""},
  };
  const ordered_json fixtures = ordered_json::parse(read_text(kDir + "fixtures.json"));
  for (const Turn& turn : turns) {
    SCOPED_TRACE(turn.template_id);
    const ordered_json* found = nullptr;
    for (const ordered_json& c : fixtures["cases"]) {
      if (c["template"] == turn.template_id && c["conversation"] == turn.conversation &&
          c.contains("expected") && c["request"].value("add_generation_prompt", false) == false) {
        found = &c;
        break;
      }
    }
    ASSERT_NE(found, nullptr);
    const std::string& rendered = (*found)["expected"].get_ref<const std::string&>();
    const size_t q = rendered.find(turn.question);
    ASSERT_NE(q, std::string::npos);
    const size_t open = rendered.find(turn.open, q);
    ASSERT_NE(open, std::string::npos);
    const size_t begin = open + turn.open.size();
    const size_t end = rendered.find(turn.close, begin);
    ASSERT_NE(end, std::string::npos);
    const std::string text = rendered.substr(begin, end - begin);
    SCOPED_TRACE(text);

    const ordered_json& request = (*found)["request"];
    std::vector<ToolCall> expected;
    for (const ordered_json& m : request["messages"]) {
      if (!m.contains("tool_calls")) continue;
      for (const ordered_json& tc : m["tool_calls"]) {
        const bool keeps_id = turn.format == F::kMistral;
        expected.push_back(call(tc["function"]["name"], tc["function"]["arguments"].dump(),
                                keeps_id ? tc["id"].get<std::string>() : ""));
      }
      break;
    }
    ASSERT_FALSE(expected.empty());
    // The request's tools type the XML formats' values (city a string, days an integer).
    const json tools = json::parse(request["tools"].dump());
    const ToolCallDelta d = ToolCallParser::parse(turn.format, text, tools);
    std::string content = d.content;
    while (!content.empty() && (content.back() == '\n' || content.back() == ' '))
      content.pop_back();
    EXPECT_EQ(content, turn.content);
    EXPECT_EQ(show(d.calls), show(expected));
    for (size_t i = 0; i <= text.size(); ++i) {  // and streamed, split anywhere
      ToolCallParser p(turn.format, tools);
      ToolCallDelta a = p.feed(std::string_view(text).substr(0, i));
      ToolCallDelta b = p.feed(std::string_view(text).substr(i));
      ToolCallDelta c = p.finish();
      EXPECT_EQ(a.content + b.content + c.content, d.content);
      EXPECT_EQ(a.calls.size() + b.calls.size() + c.calls.size(), d.calls.size());
    }
  }
}

}  // namespace
}  // namespace metrale::chat
