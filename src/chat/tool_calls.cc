// Tool-call parsers: one state machine for every format. Content flows out as soon as it
// cannot be the start of a start marker; a call's text is held from its start marker to its
// end marker (or, for mistral and llama3_json, to the end of the text) and then parsed whole,
// so the result never depends on how the text was split into feed() calls.
#include "chat/tool_calls.h"

#include <algorithm>
#include <array>
#include <exception>
#include <initializer_list>
#include <utility>

#include "core/error.h"

namespace metrale::chat {
namespace {

using nlohmann::ordered_json;  // arguments keep the key order the model wrote

constexpr size_t kNpos = std::string_view::npos;
constexpr int kMaxDepth = 64;  // a call whose JSON nests deeper is content

constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

constexpr std::array<std::pair<ToolCallFormat, std::string_view>, 7> kNames = {{
    {ToolCallFormat::kNone, "none"},
    {ToolCallFormat::kHermes, "hermes"},
    {ToolCallFormat::kQwen3Coder, "qwen3_coder"},
    {ToolCallFormat::kGlm45, "glm45"},
    {ToolCallFormat::kDeepSeekV3, "deepseek_v3"},
    {ToolCallFormat::kMistral, "mistral"},
    {ToolCallFormat::kLlama3Json, "llama3_json"},
}};

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

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

// The length of the longest suffix of `buf` that is a proper prefix of one of `markers`: what
// may still become a marker when more text comes.
size_t held_prefix(std::string_view buf, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    for (size_t k = std::min(buf.size(), m.size() - 1); k > best; --k) {
      if (buf.substr(buf.size() - k) == m.substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

// The earliest of `markers` in `buf` from `from`: its position and index (kNpos if none).
std::pair<size_t, size_t> find_first(std::string_view buf,
                                     std::initializer_list<std::string_view> markers, size_t from) {
  std::pair<size_t, size_t> best{kNpos, 0};
  size_t i = 0;
  for (std::string_view m : markers) {
    const size_t p = buf.find(m, from);
    if (p < best.first) best = {p, i};
    ++i;
  }
  return best;
}

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

}  // namespace

std::string_view tool_call_format_name(ToolCallFormat f) {
  for (const auto& [format, name] : kNames) {
    if (format == f) return name;
  }
  return "none";
}

ToolCallFormat tool_call_format_from_name(std::string_view name) {
  std::string valid;
  for (const auto& [format, n] : kNames) {
    if (n == name) return format;
    valid += valid.empty() ? "" : ", ";
    valid += n;
  }
  throw make_error("unknown tool call format '", name, "' (valid: ", valid, ")");
}

ToolCallFormat detect_tool_call_format(std::string_view src) {
  const auto has = [&](std::string_view s) { return src.find(s) != kNpos; };
  if (has(kToolCallOpen)) {
    if (has("<function=")) return ToolCallFormat::kQwen3Coder;
    if (has("<arg_key>")) return ToolCallFormat::kGlm45;
    return ToolCallFormat::kHermes;
  }
  if (has("tool▁calls▁begin")) return ToolCallFormat::kDeepSeekV3;
  if (has(kMistralCalls)) return ToolCallFormat::kMistral;
  if (has(kPythonTag) || (has("<|start_header_id|>") && has("\"parameters\": "))) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

ToolCallSpelling detect_tool_call_spelling(ToolCallFormat f, std::string_view src) {
  if (f == ToolCallFormat::kMistral && src.find(kMistralArgs) != kNpos) {
    return ToolCallSpelling::kMistralArgs;
  }
  // V3 fences the arguments in ```json; V3.1 writes them bare after the name.
  if (f == ToolCallFormat::kDeepSeekV3 && src.find("```json") == kNpos) {
    return ToolCallSpelling::kDeepSeekV31;
  }
  return ToolCallSpelling::kDefault;
}

bool tool_call_markers_are_special(ToolCallFormat f) {
  return f == ToolCallFormat::kMistral || f == ToolCallFormat::kLlama3Json ||
         f == ToolCallFormat::kGlm45;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, const nlohmann::json& tools)
    : format_(format), tools_(tools) {}

ToolCallDelta ToolCallParser::parse(ToolCallFormat format, std::string_view text,
                                    const nlohmann::json& tools) {
  ToolCallParser p(format, tools);
  ToolCallDelta out = p.feed(text);
  ToolCallDelta rest = p.finish();
  out.content += rest.content;
  for (ToolCall& c : rest.calls) out.calls.push_back(std::move(c));
  return out;
}

ToolCallDelta ToolCallParser::feed(std::string_view text) {
  ToolCallDelta out;
  if (format_ == ToolCallFormat::kNone) {
    out.content.assign(text);
    return out;
  }
  buffer_.append(text);
  step(out, /*at_end=*/false);
  return out;
}

ToolCallDelta ToolCallParser::finish() {
  ToolCallDelta out;
  if (format_ == ToolCallFormat::kNone) return out;
  step(out, /*at_end=*/true);
  buffer_.clear();
  pending_.clear();  // whitespace after the last call: dropped
  after_call_ = false;
  mode_ = Mode::kContent;
  return out;
}

void ToolCallParser::emit_content(ToolCallDelta& out, std::string_view text) {
  if (text.empty()) return;
  if (after_call_) {
    if (all_space(text)) {
      pending_.append(text);
      return;
    }
    out.content += pending_;
    pending_.clear();
    after_call_ = false;
  }
  out.content.append(text);
}

void ToolCallParser::emit_block_content(ToolCallDelta& out, std::string_view text) {
  if (text.empty()) return;
  if (!block_pending_.empty()) {
    if (all_space(text)) {
      block_pending_.append(text);
      return;
    }
    std::string s = std::move(block_pending_);
    block_pending_.clear();
    s.append(text);
    emit_content(out, s);
    return;
  }
  emit_content(out, text);
}

void ToolCallParser::emit_call(ToolCallDelta& out, ToolCall call) {
  pending_.clear();
  block_pending_.clear();
  after_call_ = true;
  block_has_call_ = true;
  out.calls.push_back(std::move(call));
  ++calls_seen_;
}

void ToolCallParser::step(ToolCallDelta& out, bool at_end) {
  if (format_ == ToolCallFormat::kLlama3Json) {
    if (at_start_) step_llama_start(out, at_end);
    if (at_start_) return;
    if (mode_ == Mode::kContent) {
      out.content += buffer_;
      buffer_.clear();
    } else if (at_end) {
      finish_rest(out, buffer_);
      buffer_.clear();
    }
    return;
  }
  while (true) {
    const Mode before = mode_;
    if (mode_ == Mode::kContent) {
      step_content(out, at_end);
    } else if (mode_ == Mode::kCall) {
      if (!step_call(out, at_end)) return;
    } else {
      step_block(out, at_end);
    }
    if (mode_ == before && mode_ != Mode::kCall) return;
  }
}

void ToolCallParser::step_llama_start(ToolCallDelta& out, bool at_end) {
  const size_t i = buffer_.find_first_not_of(" \n\r\t");
  if (i == std::string::npos) {
    if (at_end) {
      out.content += buffer_;
      buffer_.clear();
      at_start_ = false;
    }
    return;
  }
  const std::string_view rest = std::string_view(buffer_).substr(i);
  if (rest.front() == '{' || starts_with(rest, kPythonTag)) {
    mode_ = Mode::kCall;
  } else if (!at_end && starts_with(kPythonTag, rest)) {
    return;  // may still become <|python_tag|>
  } else {
    mode_ = Mode::kContent;
  }
  at_start_ = false;
  (void)out;
}

void ToolCallParser::step_content(ToolCallDelta& out, bool at_end) {
  std::string_view start = kToolCallOpen;
  if (format_ == ToolCallFormat::kDeepSeekV3) start = kDsCallsBegin;
  if (format_ == ToolCallFormat::kMistral) start = kMistralCalls;
  const std::string_view buf = buffer_;
  const size_t pos = buf.find(start);
  if (pos != kNpos) {
    emit_content(out, buf.substr(0, pos));
    if (format_ == ToolCallFormat::kDeepSeekV3) {
      block_pending_ = std::string(start);
      block_has_call_ = false;
      buffer_.erase(0, pos + start.size());
      mode_ = Mode::kBlock;
    } else {
      buffer_.erase(0, pos);
      scan_ = start.size();
      mode_ = Mode::kCall;
    }
    return;
  }
  const size_t keep = at_end ? 0 : held_prefix(buf, {start});
  emit_content(out, buf.substr(0, buf.size() - keep));
  buffer_.erase(0, buffer_.size() - keep);
}

void ToolCallParser::step_block(ToolCallDelta& out, bool at_end) {
  const std::string_view buf = buffer_;
  const auto [pos, which] = find_first(buf, {kDsCallBegin, kDsCallsEnd}, 0);
  if (pos != kNpos) {
    emit_block_content(out, buf.substr(0, pos));
    if (which == 0) {
      buffer_.erase(0, pos);
      scan_ = kDsCallBegin.size();
      mode_ = Mode::kCall;
      return;
    }
    if (!block_has_call_) emit_block_content(out, kDsCallsEnd);  // else the marker is dropped
    if (!block_pending_.empty()) emit_content(out, block_pending_);
    block_pending_.clear();
    buffer_.erase(0, pos + kDsCallsEnd.size());
    mode_ = Mode::kContent;
    return;
  }
  const size_t keep = at_end ? 0 : held_prefix(buf, {kDsCallBegin, kDsCallsEnd});
  emit_block_content(out, buf.substr(0, buf.size() - keep));
  buffer_.erase(0, buffer_.size() - keep);
  if (at_end) {
    if (!block_pending_.empty()) emit_content(out, block_pending_);
    block_pending_.clear();
    mode_ = Mode::kContent;
  }
}

bool ToolCallParser::step_call(ToolCallDelta& out, bool at_end) {
  if (format_ == ToolCallFormat::kMistral) {  // the calls run to the end of the text
    if (!at_end) return false;
    finish_rest(out, buffer_);
    buffer_.clear();
    mode_ = Mode::kContent;
    return true;
  }
  const bool deepseek = format_ == ToolCallFormat::kDeepSeekV3;
  const std::string_view end = deepseek ? kDsCallEnd : kToolCallClose;
  const std::string_view buf = buffer_;
  // DeepSeek: a <｜tool▁calls▁end｜> before the call's end ends the call unterminated. Hermes'
  // JSON and the XML formats' JSON values may spell the end marker inside their strings: their
  // end is searched past those (rescanning the held call each time; calls are short).
  std::pair<size_t, size_t> found;
  if (deepseek) {
    found = find_first(buf, {kDsCallEnd, kDsCallsEnd}, scan_);
  } else if (format_ == ToolCallFormat::kHermes) {
    found = {value_end(buf, kToolCallOpen.size(), end, /*json=*/true), 0};
  } else if (format_ == ToolCallFormat::kQwen3Coder || format_ == ToolCallFormat::kGlm45) {
    found = {xml_call_end(buf, format_ == ToolCallFormat::kGlm45 ? kGlm45Layout : kQwen3CoderLayout,
                          tools_),
             0};
  } else {
    found = find_first(buf, {end}, scan_);
  }
  const auto [pos, which] = found;
  const auto resolve = [&](std::string_view text, bool closed) {
    if (std::optional<ToolCall> call = parse_one(text, closed)) {
      emit_call(out, std::move(*call));
    } else if (deepseek) {
      emit_block_content(out, text);
    } else {
      emit_content(out, text);
    }
  };
  const Mode after = deepseek ? Mode::kBlock : Mode::kContent;
  if (pos != kNpos) {
    const size_t len = which == 0 ? end.size() : 0;
    resolve(buf.substr(0, pos + len), /*closed=*/which == 0);
    buffer_.erase(0, pos + len);
    mode_ = after;
    return true;
  }
  if (at_end) {
    resolve(buf, /*closed=*/false);
    buffer_.clear();
    mode_ = after;
    return true;
  }
  const size_t longest = deepseek ? std::max(kDsCallEnd.size(), kDsCallsEnd.size()) : end.size();
  scan_ = std::max(scan_, buf.size() >= longest ? buf.size() - longest + 1 : size_t{0});
  return false;
}

std::optional<ToolCall> ToolCallParser::parse_one(std::string_view text, bool closed) const {
  std::string_view body = text;
  switch (format_) {
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kQwen3Coder:
    case ToolCallFormat::kGlm45: {
      body.remove_prefix(kToolCallOpen.size());
      // Unterminated: the text may end inside the end marker (max_tokens right there).
      body.remove_suffix(closed ? kToolCallClose.size() : held_prefix(body, {kToolCallClose}));
      if (format_ == ToolCallFormat::kQwen3Coder) return parse_qwen3_coder(body, tools_);
      if (format_ == ToolCallFormat::kGlm45) return parse_glm45(body, closed, tools_);
      const std::optional<ordered_json> j = parse_json(trim(body));
      if (!j) return std::nullopt;
      return call_from_object(*j, /*take_id=*/false);
    }
    case ToolCallFormat::kDeepSeekV3:
      body.remove_prefix(kDsCallBegin.size());
      body.remove_suffix(closed ? kDsCallEnd.size() : held_prefix(body, {kDsCallEnd, kDsCallsEnd}));
      return parse_deepseek(body);
    default:
      return std::nullopt;
  }
}

void ToolCallParser::finish_rest(ToolCallDelta& out, std::string_view rest) {
  std::vector<ToolCall> calls;
  std::string_view tail;  // text after the last call: content
  if (format_ == ToolCallFormat::kLlama3Json) {
    // {...} or <|python_tag|>{...}, several joined by ";"
    std::string_view s = ltrim(rest);
    if (starts_with(s, kPythonTag)) s.remove_prefix(kPythonTag.size());
    while (true) {
      s = ltrim(s);
      if (s.empty() && !calls.empty()) break;
      if (!starts_with(s, "{")) {
        if (calls.empty()) break;
        tail = s;
        break;
      }
      const size_t end = scan_brackets(s, /*whole=*/false);
      std::optional<ordered_json> j;
      if (end != kNpos) j = parse_json(s.substr(0, end));
      std::optional<ToolCall> call;
      if (j) call = call_from_object(*j, /*take_id=*/false);
      if (!call) {
        calls.clear();
        break;
      }
      calls.push_back(std::move(*call));
      s = ltrim(s.substr(end));
      if (starts_with(s, ";")) s.remove_prefix(1);
    }
    if (calls.empty()) {
      out.content.append(rest);
      return;
    }
    for (ToolCall& c : calls) emit_call(out, std::move(c));
    emit_content(out, tail);
    return;
  }
  // mistral: `rest` starts with [TOOL_CALLS].
  const std::string_view after = rest.substr(kMistralCalls.size());
  const std::string_view s = ltrim(after);
  if (starts_with(s, "[") || starts_with(s, "{")) {  // Nemo: a JSON list of calls (or one call)
    const size_t end = scan_brackets(s, /*whole=*/false);
    std::optional<ordered_json> j;
    if (end != kNpos) j = parse_json(s.substr(0, end));
    if (j && j->is_object()) j = ordered_json::array({std::move(*j)});
    bool ok = j && j->is_array() && !j->empty();
    if (ok) {
      for (const ordered_json& o : *j) {
        std::optional<ToolCall> call = call_from_object(o, /*take_id=*/true);
        if (!call) {
          ok = false;
          break;
        }
        calls.push_back(std::move(*call));
      }
    }
    if (!ok) {
      emit_content(out, rest);
      return;
    }
    for (ToolCall& c : calls) emit_call(out, std::move(c));
    emit_content(out, s.substr(end));
    return;
  }
  // v11: [TOOL_CALLS]N[CALL_ID]id[ARGS]{...} or [TOOL_CALLS]N[ARGS]{...}, repeated.
  size_t at = 0;  // index of this segment's [TOOL_CALLS] in rest
  while (at < rest.size()) {
    size_t next = rest.find(kMistralCalls, at + kMistralCalls.size());
    if (next == kNpos) next = rest.size();
    const std::string_view seg = rest.substr(at, next - at);
    const std::string_view body = seg.substr(kMistralCalls.size());
    std::optional<ToolCall> call;
    std::string_view seg_tail;
    const size_t args = body.find(kMistralArgs);
    if (args != kNpos) {
      const std::string_view head = body.substr(0, args);
      const size_t cid = head.find(kMistralCallId);
      ToolCall c;
      c.name = std::string(trim(head.substr(0, cid)));
      if (cid != kNpos) c.id = std::string(trim(head.substr(cid + kMistralCallId.size())));
      const std::string_view json = ltrim(body.substr(args + kMistralArgs.size()));
      if (!c.name.empty() && starts_with(json, "{")) {
        const size_t end = scan_brackets(json, /*whole=*/false);
        std::optional<std::string> a;
        if (end != kNpos) a = arguments_text(json.substr(0, end));
        if (a) {
          c.arguments = std::move(*a);
          call = std::move(c);
          seg_tail = json.substr(end);
        }
      }
    }
    if (call) {
      emit_call(out, std::move(*call));
      emit_content(out, seg_tail);
    } else {
      emit_content(out, seg);
    }
    at = next;
  }
}

}  // namespace metrale::chat
