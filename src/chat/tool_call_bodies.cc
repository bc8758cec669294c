// One call's text, per format, and the text and JSON helpers it needs (tool_call_bodies.h).
#include "chat/tool_call_bodies.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "core/error.h"

namespace metrale::chat::detail {

using nlohmann::ordered_json;  // arguments keep the key order the model wrote

namespace {

constexpr int kMaxDepth = 64;  // a call whose JSON nests deeper is content

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

bool all_space(std::string_view s) { return std::all_of(s.begin(), s.end(), is_space); }

std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view trim(std::string_view s) {
  s = ltrim(s);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Where JSON-ish text stands relative to its strings, a character at a time.
struct JsonStrings {
  bool newline_ends = false;  // a raw newline ends a string (JSON has none inside one)
  bool in_string = false, escaped = false;
  // Whether `c` belongs to a string (its quotes included).
  bool inside(char c) {
    if (in_string) {
      if (newline_ends && c == '\n') {
        in_string = false;
      } else if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      return true;
    }
    in_string = c == '"';
    return in_string;
  }
};

// Scans JSON-ish text outside strings. Returns the index past the bracket that closes the
// value `s` starts with ('{' or '['), or kNpos when it never closes or nests deeper than
// kMaxDepth. With `whole`, scans all of `s` and returns 0 when the nesting stays within the
// limit (kNpos otherwise).
size_t scan_brackets(std::string_view s, bool whole) {
  int depth = 0;
  JsonStrings strings;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (strings.inside(c)) continue;
    if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return kNpos;
    } else if (c == '}' || c == ']') {
      --depth;
      if (!whole && depth <= 0) return i + 1;
    }
  }
  return whole ? 0 : kNpos;
}

// Strict JSON, never throwing; nullopt for anything malformed or nested too deep (nlohmann's
// parser is iterative, but copies and dump() recurse).
std::optional<ordered_json> parse_json(std::string_view s) {
  if (scan_brackets(s, /*whole=*/true) == kNpos) return std::nullopt;
  try {
    ordered_json j = ordered_json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string dump(const ordered_json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::replace);
}

// {"name": N, "arguments" (or "parameters"): {...}} -> a call. Arguments written as a JSON
// string holding an object are accepted; missing arguments are {}.
std::optional<ToolCall> call_from_object(const ordered_json& o, bool take_id) {
  if (!o.is_object()) return std::nullopt;
  const auto name = o.find("name");
  if (name == o.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  auto args = o.find("arguments");
  if (args == o.end()) args = o.find("parameters");
  ToolCall call;
  call.name = name->get<std::string>();
  if (args == o.end()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = dump(*args);
  } else if (args->is_string()) {
    const std::optional<ordered_json> inner = parse_json(args->get_ref<const std::string&>());
    if (!inner || !inner->is_object()) return std::nullopt;
    call.arguments = dump(*inner);
  } else {
    return std::nullopt;
  }
  if (take_id) {
    const auto id = o.find("id");
    if (id != o.end() && id->is_string()) call.id = id->get<std::string>();
  }
  return call;
}

// The JSON object `s` holds (whitespace around allowed) as a call's arguments text.
std::optional<std::string> arguments_text(std::string_view s) {
  const std::optional<ordered_json> j = parse_json(trim(s));
  if (!j || !j->is_object()) return std::nullopt;
  return dump(*j);
}

std::string_view strip_one_newline(std::string_view v) {
  if (starts_with(v, "\n")) v.remove_prefix(1);
  if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
  return v;
}

// The JSON schema type of parameter `key` of function `name` in the request's tools, or null.
const nlohmann::json* schema_type(const nlohmann::json& tools, std::string_view name,
                                  std::string_view key) {
  if (!tools.is_array()) return nullptr;
  for (const nlohmann::json& t : tools) {
    if (!t.is_object()) continue;
    const auto f = t.find("function");
    const nlohmann::json& fn = f != t.end() && f->is_object() ? *f : t;
    const auto n = fn.find("name");
    if (n == fn.end() || !n->is_string() || n->get_ref<const std::string&>() != name) continue;
    const auto params = fn.find("parameters");
    if (params == fn.end() || !params->is_object()) return nullptr;
    const auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return nullptr;
    const auto p = props->find(std::string(key));
    if (p == props->end() || !p->is_object()) return nullptr;
    const auto type = p->find("type");
    return type == p->end() ? nullptr : &*type;
  }
  return nullptr;
}

bool is_string_type(const nlohmann::json* type) {
  if (type == nullptr) return false;
  if (type->is_string()) return type->get_ref<const std::string&>() == "string";
  if (!type->is_array() || type->empty()) return false;
  return std::all_of(type->begin(), type->end(),
                     [](const nlohmann::json& t) { return t == "string"; });
}

// An XML-format value: a string where the schema says string, else JSON if it parses.
ordered_json typed_value(const nlohmann::json& tools, std::string_view name, std::string_view key,
                         std::string_view value) {
  if (!is_string_type(schema_type(tools, name, key))) {
    if (std::optional<ordered_json> j = parse_json(value)) return std::move(*j);
  }
  return ordered_json(std::string(value));
}

// Where a value that starts at `from` ends: the first `marker` past it; or, when `json` (the
// schema does not type it a string) and it opens a JSON object, array or string, the first
// `marker` outside its JSON strings, which may spell any marker. A raw newline ends a JSON
// string too (JSON has none inside one), so malformed text cannot hide a marker for long.
// kNpos: not (yet) there.
size_t value_end(std::string_view s, size_t from, std::string_view marker, bool json) {
  size_t i = from;
  while (i < s.size() && is_space(s[i])) ++i;
  if (!json || i >= s.size() || (s[i] != '{' && s[i] != '[' && s[i] != '"')) {
    return s.find(marker, from);
  }
  JsonStrings strings{.newline_ends = true};
  for (; i < s.size(); ++i) {
    if (!strings.inside(s[i]) && s.compare(i, marker.size(), marker) == 0) return i;
  }
  return kNpos;
}

// Whether parameter `key`'s value may be JSON (typed_value's rule: the schema does not say
// string).
bool json_value(const nlohmann::json& tools, std::string_view name, std::string_view key) {
  return !is_string_type(schema_type(tools, name, key));
}

// The XML formats' layout of one call body (after <tool_call>):
//   qwen3_coder: <function=N>\n<parameter=K>\nV\n</parameter>\n...</function>
//   glm45:       N<arg_key>K</arg_key><arg_value>V</arg_value>...
struct XmlLayout {
  bool glm = false;
  std::string_view key_open, key_close, value_open, value_close;
};
constexpr XmlLayout kQwen3CoderLayout{false, "<parameter=", ">", "", "</parameter>"};
constexpr XmlLayout kGlm45Layout{true, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};

// Where the call's end marker is in `buf` (which starts with <tool_call>): past the function
// name and every parameter value, so that a JSON value's strings may spell any marker (the
// forced-call grammar lets them). A body that does not follow the layout ends at the first end
// marker after where the layout broke. kNpos: not (yet) there.
size_t xml_call_end(std::string_view buf, const XmlLayout& l, const nlohmann::json& tools) {
  size_t at = kToolCallOpen.size();
  // What text may still become, when it ends inside a marker it expects.
  const auto pending = [&](std::string_view m) {
    const std::string_view rest = buf.substr(std::min(at, buf.size()));
    return rest.size() < m.size() && m.substr(0, rest.size()) == rest;
  };
  std::string name;
  if (!l.glm) {
    constexpr std::string_view kFunction = "<function=";
    while (at < buf.size() && is_space(buf[at])) ++at;
    if (pending(kFunction)) return kNpos;
    if (buf.compare(at, kFunction.size(), kFunction) != 0) return buf.find(kToolCallClose, at);
    const size_t gt = buf.find('>', at);
    if (gt == kNpos) return kNpos;
    name = std::string(trim(buf.substr(at + kFunction.size(), gt - at - kFunction.size())));
    at = gt + 1;
  } else {
    const size_t key = buf.find(l.key_open, at);
    const size_t close = buf.find(kToolCallClose, at);
    if (close != kNpos && (key == kNpos || close < key)) return close;  // a call without arguments
    if (key == kNpos) return kNpos;
    name = std::string(trim(buf.substr(at, key - at)));
    at = key;
  }
  for (;;) {
    while (at < buf.size() && is_space(buf[at])) ++at;
    if (at >= buf.size() || pending(l.key_open)) return kNpos;
    if (buf.compare(at, l.key_open.size(), l.key_open) != 0) break;  // past the parameters
    const size_t key_end = buf.find(l.key_close, at + l.key_open.size());
    if (key_end == kNpos) return kNpos;
    const std::string_view key =
        trim(buf.substr(at + l.key_open.size(), key_end - at - l.key_open.size()));
    at = key_end + l.key_close.size();
    if (!l.value_open.empty()) {
      while (at < buf.size() && is_space(buf[at])) ++at;
      if (at >= buf.size() || pending(l.value_open)) return kNpos;
      if (buf.compare(at, l.value_open.size(), l.value_open) != 0)
        return buf.find(kToolCallClose, at);
      at += l.value_open.size();
    }
    const size_t end = value_end(buf, at, l.value_close, json_value(tools, name, key));
    if (end == kNpos) return kNpos;
    at = end + l.value_close.size();
  }
  return buf.find(kToolCallClose, at);
}

// qwen3_coder: <function=N>\n<parameter=K>\nV\n</parameter>\n...</function>
std::optional<ToolCall> parse_qwen3_coder(std::string_view body, const nlohmann::json& tools) {
  constexpr std::string_view kFunction = "<function=";
  constexpr std::string_view kParam = "<parameter=";
  constexpr std::string_view kParamEnd = "</parameter>";
  constexpr std::string_view kFunctionEnd = "</function>";
  std::string_view s = trim(body);
  if (!starts_with(s, kFunction)) return std::nullopt;
  size_t gt = s.find('>');
  if (gt == kNpos) return std::nullopt;
  ToolCall call;
  call.name = std::string(trim(s.substr(kFunction.size(), gt - kFunction.size())));
  if (call.name.empty() || call.name.find('<') != std::string::npos) return std::nullopt;
  ordered_json args = ordered_json::object();
  s = s.substr(gt + 1);
  while (true) {
    s = ltrim(s);
    if (starts_with(s, kParam)) {
      gt = s.find('>');
      if (gt == kNpos) return std::nullopt;
      const std::string_view key = trim(s.substr(kParam.size(), gt - kParam.size()));
      size_t end = value_end(s, gt + 1, kParamEnd, json_value(tools, call.name, key));
      if (end == kNpos) end = s.find(kParamEnd, gt + 1);  // malformed JSON: the first marker
      if (end == kNpos) return std::nullopt;
      const std::string_view value = strip_one_newline(s.substr(gt + 1, end - gt - 1));
      args[std::string(key)] = typed_value(tools, call.name, key, value);
      s = s.substr(end + kParamEnd.size());
    } else if (starts_with(s, kFunctionEnd)) {
      s = s.substr(kFunctionEnd.size());
      break;
    } else {
      return std::nullopt;
    }
  }
  if (!trim(s).empty()) return std::nullopt;
  call.arguments = dump(args);
  return call;
}

// glm45: N<arg_key>K</arg_key><arg_value>V</arg_value>... (whitespace between parts optional)
std::optional<ToolCall> parse_glm45(std::string_view body, bool closed,
                                    const nlohmann::json& tools) {
  constexpr std::string_view kKey = "<arg_key>";
  constexpr std::string_view kKeyEnd = "</arg_key>";
  constexpr std::string_view kValue = "<arg_value>";
  constexpr std::string_view kValueEnd = "</arg_value>";
  const size_t first = body.find(kKey);
  ToolCall call;
  call.name = std::string(trim(body.substr(0, first)));
  if (call.name.empty() || call.name.find('<') != std::string::npos) return std::nullopt;
  // An unterminated call is complete only when its last argument closed.
  if (!closed && (first == kNpos || !trim(body).ends_with(kValueEnd))) return std::nullopt;
  ordered_json args = ordered_json::object();
  std::string_view s = first == kNpos ? std::string_view() : body.substr(first);
  while (true) {
    s = ltrim(s);
    if (s.empty()) break;
    if (!starts_with(s, kKey)) return std::nullopt;
    const size_t key_end = s.find(kKeyEnd);
    if (key_end == kNpos) return std::nullopt;
    const std::string_view key = trim(s.substr(kKey.size(), key_end - kKey.size()));
    s = ltrim(s.substr(key_end + kKeyEnd.size()));
    if (!starts_with(s, kValue)) return std::nullopt;
    size_t end = value_end(s, kValue.size(), kValueEnd, json_value(tools, call.name, key));
    if (end == kNpos) end = s.find(kValueEnd);  // malformed JSON: the first marker
    if (end == kNpos) return std::nullopt;
    const std::string_view value = strip_one_newline(s.substr(kValue.size(), end - kValue.size()));
    args[std::string(key)] = typed_value(tools, call.name, key, value);
    s = s.substr(end + kValueEnd.size());
  }
  call.arguments = dump(args);
  return call;
}

// deepseek_v3 call body: V3 `TYPE<｜tool▁sep｜>N\n```json\n{...}\n```` or V3.1
// `N<｜tool▁sep｜>{...}`.
std::optional<ToolCall> parse_deepseek(std::string_view body) {
  const size_t sep = body.find(kDsSep);
  if (sep == kNpos) return std::nullopt;
  const std::string_view left = trim(body.substr(0, sep));
  const std::string_view right = body.substr(sep + kDsSep.size());
  ToolCall call;
  std::string_view json;
  if (starts_with(ltrim(right), "{")) {  // V3.1
    call.name = std::string(left);
    json = right;
  } else {  // V3: the type (always "function") before the separator, the name after it
    const size_t nl = right.find('\n');
    if (nl == kNpos) return std::nullopt;
    call.name = std::string(trim(right.substr(0, nl)));
    json = trim(right.substr(nl));
    if (starts_with(json, "```json")) {
      json.remove_prefix(7);
    } else if (starts_with(json, "```")) {
      json.remove_prefix(3);
    }
    if (json.ends_with("```")) json.remove_suffix(3);
  }
  if (call.name.empty()) return std::nullopt;
  std::optional<std::string> args = arguments_text(json);
  if (!args) return std::nullopt;
  call.arguments = std::move(*args);
  return call;
}

size_t xml_call_end(std::string_view buf, bool glm, const nlohmann::json& tools) {
  return xml_call_end(buf, glm ? kGlm45Layout : kQwen3CoderLayout, tools);
}

}  // namespace metrale::chat::detail
