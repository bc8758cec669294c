// The interpreter beyond the fixtures: errors name the source, line:column and the construct;
// limits stop runaway templates; loading finds the template a checkpoint ships.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "chat/chat_template.h"
#include "chat/template.h"
#include "support/test_support.h"

namespace metrale::chat {
namespace {

std::string render(const std::string& text, const RenderOptions& options = {}) {
  const Template t(text, "t.jinja");
  return t.render(Dict(), options);
}

std::string error_of(const std::string& text, const RenderOptions& options = {}) {
  return test::error_of([&] { render(text, options); });
}

TEST(ChatInterpreter, WhitespaceControl) {
  EXPECT_EQ(render("{% if true %}\n  a\n{% endif %}\nb"), "  a\nb");
  EXPECT_EQ(render("x\n    {% if true %}\ny\n    {% endif %}\nz"), "x\ny\nz");
  EXPECT_EQ(render("a \n {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif +%}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("a\r\nb\r\n"), "a\nb");  // newlines normalised, one trailing newline dropped
}

TEST(ChatInterpreter, ParseErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("ok\n  {{ x + }}"), "t.jinja:2:10: expected an expression, found '}}'");
  EXPECT_EQ(error_of("{% if x %}never closed"),
            "t.jinja:1:23: unexpected end of template, expected 'elif' or 'else' or 'endif'");
  EXPECT_EQ(error_of("\n{{ x|frobnicate }}"), "t.jinja:2:6: unsupported filter 'frobnicate'");
  EXPECT_EQ(error_of("{{ x is frob }}"), "t.jinja:1:6: unsupported test 'frob'");
  EXPECT_EQ(
      error_of("{% include 'other.jinja' %}"),
      "t.jinja:1:4: unsupported tag '{% include %}' (chat templates are rendered on their own)");
  EXPECT_EQ(error_of("{{ 'open"), "t.jinja:1:4: unterminated string");
  EXPECT_EQ(error_of("{{ (1 }}"), "t.jinja:1:7: unexpected '}', expected ')'");
  EXPECT_EQ(error_of("{# no end"), "t.jinja:1:1: missing end of comment tag '#}'");
  EXPECT_EQ(error_of("{% for x in y recursive %}{% endfor %}"),
            "t.jinja:1:15: unsupported: recursive loops");
}

TEST(ChatInterpreter, RenderErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("\n\n   {{ raise_exception('bad role') }}"),
            "t.jinja:3:7: raise_exception: bad role");
  EXPECT_EQ(error_of("{{ u.x }}"), "t.jinja:1:5: 'u' is undefined");
  EXPECT_EQ(error_of("{{ 'a' + u }}"), "t.jinja:1:8: 'u' is undefined");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"),
            "t.jinja:1:8: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(error_of("{% for x in none %}{% endfor %}"),
            "t.jinja:1:4: 'NoneType' object is not iterable");
  EXPECT_EQ(error_of("{% set l = [] %}{{ l.append(1) }}"),
            "t.jinja:1:21: access to attribute 'append' of 'list' object is unsafe");
  EXPECT_EQ(error_of("{% set d = {} %}{% set d.x = 1 %}"),
            "t.jinja:1:20: cannot assign attribute on non-namespace object");
  EXPECT_EQ(error_of("{{ 2 ** 100 }}"), "t.jinja:1:6: integer overflow (beyond int64) in '**'");
  EXPECT_EQ(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
            "t.jinja:1:34: macro 'm' takes not more than 1 argument(s)");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "t.jinja:1:6: integer division or modulo by zero");
}

TEST(ChatInterpreter, LimitsStopRunawayTemplates) {
  RenderOptions o;
  o.limits.max_steps = 10000;
  o.limits.max_output_bytes = 1000;
  o.limits.max_call_depth = 16;
  EXPECT_NE(
      error_of("{% for i in range(100) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", o)
          .find("RenderLimits::max_steps"),
      std::string::npos);
  EXPECT_NE(error_of("{{ range(10 ** 15)|length }}", o).find("max_steps"), std::string::npos);
  EXPECT_NE(
      error_of("{% for i in range(1000) %}0123456789{% endfor %}", o).find("max_output_bytes"),
      std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                     o)
                .find("max_output_bytes"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 100000 }}", o).find("max_output_bytes"), std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", o).find("max_call_depth"),
            std::string::npos);
  // A namespace holding itself prints as an error, not a stack overflow (and is freed).
  EXPECT_NE(
      error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}").find("nested more than"),
      std::string::npos);
  // Parser recursion is bounded too.
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("nesting deeper than"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '-') + "1 }}").find("nesting deeper than"),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 500; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nesting deeper than"), std::string::npos);
}

TEST(ChatInterpreter, HugeValuesStayBounded) {
  RenderOptions o;
  o.limits.max_work_bytes = 1 << 20;
  RenderOptions small;
  small.limits.max_output_bytes = 1000;
  EXPECT_EQ(render("[{{ '' * 1000000000000000000 }}{{ [] * 1000000000000000000 }}{{ 'ab' * 0 }}]"),
            "[[]]");
  EXPECT_EQ(render("{{ 'abc'[1::9223372036854775807] }}{{ 'abc'[::-9223372036854775807] }}"), "bc");
  EXPECT_EQ(
      render("{{ range(-9223372036854775807, 9223372036854775807, 9223372036854775807)|length }}"),
      "2");
  // Re-copying a big string in a loop is stopped by the work budget, not only by steps.
  EXPECT_NE(error_of("{% set s = 'x' * 100000 %}{% for i in range(1000) %}{% set t = s ~ 'a' %}"
                     "{% endfor %}",
                     o)
                .find("RenderLimits::max_work_bytes"),
            std::string::npos);
  // Printing a list that repeats a big string is refused before it is built.
  EXPECT_NE(error_of("{% set l = ['x' * 100000] * 1000 %}{{ l }}").find("larger than"),
            std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 400)|replace('', 'yy') }}", small).find("max_output_bytes"),
            std::string::npos);
  EXPECT_NE(error_of("{{ [[[1]]]|tojson(indent=1000000000) }}").find("larger than"),
            std::string::npos);
}

TEST(ChatInterpreter, StrftimeNowUsesTheInjectedClock) {
  RenderOptions o;
  o.now = [] {
    std::tm t{};
    t.tm_year = 124;
    t.tm_mon = 6;
    t.tm_mday = 26;
    return t;
  };
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}", o), "26 Jul 2024");
}

void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

TEST(ChatTemplateLoad, ListFormPicksDefaultToolUseOrNamed) {
  test::ScratchDir dir;
  write(dir / "tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>", "unk_token": null,
    "chat_template": [{"name": "default", "template": "D{{ bos_token }}{{ unk_token is defined }}"},
                      {"name": "tool_use", "template": "T{{ tools is none }}"}]})");
  const ChatTemplate t = ChatTemplate::load(dir.path());
  EXPECT_EQ(t.special_tokens().size(), 2u);
  const ChatRequest plain =
      ChatRequest::from_json(R"({"messages": [{"role": "user", "content": "hi"}]})", "r");
  const ChatRequest tools = ChatRequest::from_json(
      R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})", "r");
  EXPECT_EQ(t.render(plain), "D<s>False");
  EXPECT_EQ(t.render(tools), "TFalse");
  EXPECT_EQ(ChatTemplate::load(dir.path(), "tool_use").render(plain), "TTrue");
  EXPECT_EQ(test::error_of([&] { ChatTemplate::load(dir.path(), "rag"); }),
            (dir / "tokenizer_config.json").string() + ": no chat template named 'rag'");
}

TEST(ChatTemplateLoad, ChatTemplateJinjaWinsAndErrorsNameIt) {
  test::ScratchDir dir;
  write(dir / "tokenizer_config.json", R"({"eos_token": "</s>", "chat_template": "from config"})");
  write(dir / "chat_template.jinja", "{{ eos_token }}\n{{ messages[0].content + 1 }}");
  const ChatTemplate t = ChatTemplate::load(dir.path());
  const ChatRequest r =
      ChatRequest::from_json(R"({"messages": [{"role": "user", "content": "hi"}]})", "r");
  EXPECT_EQ(test::error_of([&] { t.render(r); }),
            (dir / "chat_template.jinja").string() +
                ":2:24: unsupported operand type(s) for +: 'str' and 'int'");
  std::filesystem::remove(dir / "chat_template.jinja");
  write(dir / "tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  EXPECT_EQ(test::error_of([&] { ChatTemplate::load(dir.path()); }),
            (dir / "tokenizer_config.json").string() +
                ": field 'chat_template':1:7: expected an expression, found '%}'");
}

TEST(ChatTemplateRequest, MessagesAreNormalisedAsTransformersDoes) {
  const ChatTemplate t = ChatTemplate::from_string("{{ messages[0]|tojson }}", "t");
  const ChatRequest r = ChatRequest::from_json(
      R"({"messages": [{"role": "user", "content": null, "reasoning": "r"}]})", "r");
  EXPECT_EQ(t.render(r),
            R"({"thinking": "r", "role": "user", "reasoning": "r", "reasoning_content": "r"})");
}

TEST(ChatTemplateRequest, BadRequestsAreErrors) {
  EXPECT_EQ(test::error_of(
                [] { ChatRequest::from_json(R"({"messages": [], "temperature": 1})", "req"); }),
            "req: unknown field 'temperature' (expected messages, tools, add_generation_prompt, "
            "chat_template_kwargs)");
  EXPECT_EQ(test::error_of([] { ChatRequest::from_json(R"({"messages": {}})", "req"); }),
            "req: field 'messages': expected a list, found dict");
  EXPECT_EQ(test::error_of([] {
              ChatRequest::from_json(R"({"messages": [)", "req");
            }).rfind("req: malformed JSON", 0),
            0u);
  const ChatTemplate t = ChatTemplate::from_string("x", "t");
  EXPECT_EQ(test::error_of([&] { t.render(ChatRequest::from_json(R"({"messages": []})", "r")); }),
            "chat request: cannot apply a chat template to an empty conversation");
  EXPECT_EQ(
      test::error_of([&] { t.render(ChatRequest::from_json(R"({"messages": ["hi"]})", "r")); }),
      "messages[0]: chat messages must be objects, found str");
}

}  // namespace
}  // namespace metrale::chat
