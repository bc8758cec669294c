// The grammar of a forced tool call (tool_choice "required" or a named function): the reply is
// exactly one call in the template's tool-call format, as chat/tool_calls.h parses it back,
// its arguments matching the tool's "parameters" schema.
//
// hermes and llama3_json are a JSON schema with literal markers around it. The other formats
// are xgrammar structural tags (GrammarSpec::Kind::kStructuralTag): each marker is a "token"
// element, so a marker that is one token of the tokenizer (special or not: Mistral's
// [TOOL_CALLS], GLM's <arg_key>) is written as that token and never spelled out, and no special
// token is allowed anywhere else. The arguments are a "json_schema" element (JSON formats), or
// for the XML-like ones (qwen3_coder, glm45) one element per parameter, spelled as the
// template spells it (xgrammar's qwen_xml / glm_xml styles allow blanks around a value, which
// our parsers keep in a string, and write GLM's markers as text).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "grammar/pattern.h"
#include "http/openai_api.h"
#include "http/openai_fields.h"

namespace metrale::http {

using fields::bad;
using fields::json;
using fields::unsupported;

namespace {

using ojson = nlohmann::ordered_json;

// Optional whitespace at each place a structural tag's JSON allows it: at most one blank, so
// a weak model cannot wander in blanks (hermes' JSON has none).
constexpr int kMaxBlanks = 1;

ojson text(std::string s) { return {{"type", "const_string"}, {"value", std::move(s)}}; }
ojson token(std::string s) { return {{"type", "token"}, {"token", std::move(s)}}; }
ojson sequence(ojson elements) { return {{"type", "sequence"}, {"elements", std::move(elements)}}; }
ojson arguments(ojson schema, const char* style) {
  return {{"type", "json_schema"},
          {"json_schema", std::move(schema)},
          {"style", style},
          {"max_whitespace_cnt", kMaxBlanks}};
}

struct Tool {
  std::string name;
  ojson params;  // the JSON schema of the arguments (an object schema)
};

// The XML-like formats write a "string" parameter's value raw (their templates: `v if v is
// string else v | tojson`) and any other as JSON; the parsers type the value by the schema
// the same way. A raw value ends at the first end marker, so it may not spell one: without
// constraints it is any text but the format's markers (`begin` / `end` around it), with
// them one of its values, its pattern narrowed to never write '<' (grammar/pattern.h; every
// marker starts with it), or up to its length in characters other than '<'. (A JSON value's
// strings may spell markers: the parsers end it at the first marker outside them.)
ojson raw_string(const ojson& s, const std::string& at, const char* format_name, ojson begin,
                 ojson end, const std::vector<std::string>& markers) {
  try {
    check_schema_keywords(s.dump(), "tool_choice");
  } catch (const Error& e) {
    throw ApiError(400, e.message(), "tool_choice");
  }
  if (s.contains("format")) {
    throw unsupported("tool_choice", "the JSON schema keyword 'format' (at '" + at +
                                         "') is not supported in a forced " + format_name +
                                         " tool call's string parameters");
  }
  ojson value;
  if (s.contains("const") || s.contains("enum")) {
    ojson values = s.contains("const") ? ojson::array({s["const"]}) : s["enum"];
    ojson any = ojson::array();
    for (const ojson& v : values) {
      if (!v.is_string()) continue;
      const std::string t = v.get<std::string>();
      for (const std::string& m : markers) {
        if (t.find(m) != std::string::npos) {
          throw unsupported("tool_choice",
                            "the value \"" + t + "\" (at '" + at + "') holds the marker " + m);
        }
      }
      any.push_back(text(t));
    }
    if (any.empty()) throw bad("tool_choice", "no string value matches the schema at '" + at + "'");
    value = any.size() == 1 ? any[0] : ojson{{"type", "or"}, {"elements", any}};
  } else if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) {
      throw bad("tool_choice", "'pattern' (at '" + at + "') must be a string");
    }
    // Every marker starts with '<': the value may match the pattern, but never write one.
    try {
      value = {{"type", "regex"},
               {"pattern", grammar::pattern_without(s["pattern"].get<std::string>(), '<',
                                                    "'pattern' at '" + at + "'")}};
    } catch (const Error& e) {
      throw unsupported("tool_choice", std::string(e.message()) + " (a forced " + format_name +
                                           " call writes it raw, ending it at the first marker)");
    }
  } else if (s.contains("minLength") || s.contains("maxLength")) {
    const auto bound = [&](const char* k, int64_t fallback) {
      if (!s.contains(k)) return fallback;
      if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0 || s[k].get<int64_t>() > 100000)
        throw bad("tool_choice",
                  "'" + std::string(k) + "' (at '" + at + "') must be an integer in [0, 100000]");
      return s[k].get<int64_t>();
    };
    const int64_t lo = bound("minLength", 0), hi = bound("maxLength", -1);
    value = {{"type", "regex"},
             {"pattern", "[^<]{" + std::to_string(lo) + "," +
                             (hi < 0 ? std::string() : std::to_string(hi)) + "}"}};
  } else {
    return {{"type", "tag"},
            {"begin", std::move(begin)},
            {"content", {{"type", "any_text"}, {"excludes", markers}}},
            {"end", std::move(end)}};
  }
  return sequence({std::move(begin), std::move(value), std::move(end)});
}

bool is_string_schema(const ojson& s) {
  return s.is_object() && s.contains("type") && s["type"].is_string() && s["type"] == "string";
}

// qwen3_coder, as its template writes a call:
//   <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n...</function>\n</tool_call>
// glm45:
//   <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...\n</tool_call>
// each parameter in the schema's order, the optional ones optional.
ojson xml_call(chat::ToolCallFormat format, const Tool& t) {
  const bool glm = format == chat::ToolCallFormat::kGlm45;
  const char* format_name = glm ? "glm45" : "qwen3_coder";
  const ojson& p = t.params;
  for (const char* k :
       {"anyOf", "oneOf", "allOf", "$ref", "minProperties", "maxProperties", "patternProperties"}) {
    if (p.contains(k)) {
      throw unsupported("tool_choice", "the JSON schema keyword '" + std::string(k) +
                                           "' (at '#') of tool \"" + t.name +
                                           "\" is not supported in a forced " + format_name +
                                           " tool call");
    }
  }
  if (p.contains("type") && p["type"] != "object") {
    throw unsupported("tool_choice", "tool \"" + t.name + "\": a forced " + format_name +
                                         " tool call's parameters must be an object schema");
  }
  const ojson props =
      p.contains("properties") && p["properties"].is_object() ? p["properties"] : ojson::object();
  const ojson required =
      p.contains("required") && p["required"].is_array() ? p["required"] : ojson::array();
  for (const ojson& r : required) {
    if (!r.is_string() || !props.contains(r.get<std::string>())) {
      throw bad("tool_choice", "tool \"" + t.name + "\": the required parameter " + r.dump() +
                                   " is not among its properties");
    }
  }
  const std::vector<std::string> markers =
      glm ? std::vector<std::string>{"<arg_key>",    "</arg_key>",  "<arg_value>",
                                     "</arg_value>", "<tool_call>", "</tool_call>"}
          : std::vector<std::string>{"<parameter=", "</parameter>", "</function>", "</tool_call>"};
  ojson elements =
      glm ? ojson::array({token("<tool_call>"), text(t.name)})
          : ojson::array({token("<tool_call>"), text("\n<function=" + t.name + ">\n")});
  for (const auto& [key, sub] : props.items()) {
    if (key.find('<') != std::string::npos || key.find('>') != std::string::npos) {
      throw unsupported("tool_choice", "tool \"" + t.name + "\": the parameter name \"" + key +
                                           "\" holds '<' or '>'");
    }
    ojson begin = glm ? token("<arg_value>") : text("<parameter=" + key + ">\n");
    ojson end = glm ? token("</arg_value>") : text("\n</parameter>\n");
    ojson value;
    if (is_string_schema(sub)) {
      value = raw_string(sub, "#/properties/" + key, format_name, std::move(begin), std::move(end),
                         markers);
    } else {
      ojson schema = sub;
      // A $ref into the root's definitions resolves within the parameter's own schema.
      for (const char* defs : {"$defs", "definitions"}) {
        if (p.contains(defs) && schema.is_object()) schema[defs] = p[defs];
      }
      value = sequence({std::move(begin), arguments(std::move(schema), "json"), std::move(end)});
    }
    ojson arg = glm ? sequence({text("\n"), token("<arg_key>"), text(key), token("</arg_key>"),
                                text("\n"), std::move(value)})
                    : std::move(value);
    const bool needed = std::find(required.begin(), required.end(), ojson(key)) != required.end();
    elements.push_back(needed ? std::move(arg) : ojson{{"type", "optional"}, {"content", arg}});
  }
  elements.push_back(text(glm ? "\n" : "</function>\n"));
  elements.push_back(token("</tool_call>"));
  return sequence(std::move(elements));
}

// The structural tag of one call of `t` (mistral: see forced_tool_call_grammar).
ojson call_format(chat::ToolCallFormat format, chat::ToolCallSpelling spelling, const Tool& t) {
  switch (format) {
    case chat::ToolCallFormat::kQwen3Coder:
    case chat::ToolCallFormat::kGlm45:
      return xml_call(format, t);
    case chat::ToolCallFormat::kMistral:  // Small 3.2's [TOOL_CALLS]N[ARGS]{...}
      return sequence(
          {token("[TOOL_CALLS]"), text(t.name), token("[ARGS]"), arguments(t.params, "json")});
    case chat::ToolCallFormat::kDeepSeekV3:
      if (spelling == chat::ToolCallSpelling::kDeepSeekV31) {
        // ...<｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
        return sequence({token("<｜tool▁calls▁begin｜>"), token("<｜tool▁call▁begin｜>"),
                         text(t.name), token("<｜tool▁sep｜>"), arguments(t.params, "json"),
                         token("<｜tool▁call▁end｜>"), token("<｜tool▁calls▁end｜>")});
      }
      // DeepSeek-V3's template: ...<｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}
      // \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
      return sequence({token("<｜tool▁calls▁begin｜>"), token("<｜tool▁call▁begin｜>"),
                       text("function"), token("<｜tool▁sep｜>"), text(t.name + "\n```json\n"),
                       arguments(t.params, "json"), text("\n```"), token("<｜tool▁call▁end｜>"),
                       token("<｜tool▁calls▁end｜>")});
    default:
      throw unsupported("tool_choice", "forcing a tool call is not supported for the " +
                                           std::string(chat::tool_call_format_name(format)) +
                                           " tool-call format");
  }
}

}  // namespace

GrammarSpec forced_tool_call_grammar(const nlohmann::json& tools, const std::string& name,
                                     chat::ToolCallFormat format,
                                     const ForcedCallOptions& options) {
  const bool reasoning_open = options.reasoning_open;
  std::vector<Tool> chosen;
  for (const json& t : tools) {
    Tool tool{t["function"]["name"].get<std::string>(), ojson{{"type", "object"}}};
    if (!name.empty() && tool.name != name) continue;
    if (t["function"].contains("parameters") && t["function"]["parameters"].is_object()) {
      tool.params = ojson::parse(t["function"]["parameters"].dump());
    }
    chosen.push_back(std::move(tool));
  }
  if (chosen.empty()) throw bad("tool_choice", "no tool is named \"" + name + "\"");
  GrammarSpec g;
  g.field = "tool_choice";
  // The call as a JSON object {"name": N, <args_key>: {...}} (hermes, llama3_json, mistral).
  const auto call_objects = [&](const char* args_key) {
    ojson any = ojson::array();
    for (const Tool& t : chosen) {
      any.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", t.name}}}, {args_key, t.params}}},
                     {"required", {"name", args_key}}});
    }
    return any.size() == 1 ? any[0] : ojson{{"anyOf", any}};
  };
  ojson call;
  switch (format) {
    case chat::ToolCallFormat::kHermes:
    case chat::ToolCallFormat::kLlama3Json: {
      const bool hermes = format == chat::ToolCallFormat::kHermes;
      const ojson schema = call_objects(hermes ? "arguments" : "parameters");
      if (!reasoning_open) {
        // Compact JSON, as before structural tags: a JSON schema with literal markers.
        g.kind = GrammarSpec::Kind::kJsonSchema;
        g.text = schema.dump();
        if (hermes) {
          g.prefix = "<tool_call>\n";
          g.suffix = "\n</tool_call>";
        }
        return g;
      }
      call =
          hermes
              ? sequence({text("<tool_call>\n"), arguments(schema, "json"), text("\n</tool_call>")})
              : arguments(schema, "json");
      break;
    }
    case chat::ToolCallFormat::kMistral:
      if (options.spelling != chat::ToolCallSpelling::kMistralArgs) {
        // Mistral Nemo's [TOOL_CALLS][{"name": N, "arguments": {...}}], one call in the list.
        const ojson list = {{"type", "array"},
                            {"items", call_objects("arguments")},
                            {"minItems", 1},
                            {"maxItems", 1}};
        call = sequence({token("[TOOL_CALLS]"), arguments(list, "json")});
        break;
      }
      [[fallthrough]];
    default: {
      ojson any = ojson::array();
      for (const Tool& t : chosen) any.push_back(call_format(format, options.spelling, t));
      call = any.size() == 1 ? any[0] : ojson{{"type", "or"}, {"elements", any}};
    }
  }
  if (reasoning_open) {
    // The prompt left the reply inside <think>: the reasoning is free text up to </think>
    // (vLLM constrains only what follows it), then the blanks the templates put after it.
    call = sequence({{{"type", "tag"},
                      {"begin", ""},
                      {"content", {{"type", "any_text"}}},
                      {"end", token("</think>")}},
                     {{"type", "regex"}, {"pattern", "[ \\n]{0,2}"}},
                     std::move(call)});
  }
  g.kind = GrammarSpec::Kind::kStructuralTag;
  g.text = ojson{{"type", "structural_tag"}, {"format", std::move(call)}}.dump();
  return g;
}

}  // namespace metrale::http
