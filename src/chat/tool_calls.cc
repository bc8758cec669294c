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

#include "chat/tool_call_bodies.h"
#include "core/error.h"

namespace metrale::chat {
using namespace detail;  // NOLINT(google-build-using-namespace): the parser's own pieces

namespace {

using nlohmann::ordered_json;  // arguments keep the key order the model wrote

constexpr std::array<std::pair<ToolCallFormat, std::string_view>, 7> kNames = {{
    {ToolCallFormat::kNone, "none"},
    {ToolCallFormat::kHermes, "hermes"},
    {ToolCallFormat::kQwen3Coder, "qwen3_coder"},
    {ToolCallFormat::kGlm45, "glm45"},
    {ToolCallFormat::kDeepSeekV3, "deepseek_v3"},
    {ToolCallFormat::kMistral, "mistral"},
    {ToolCallFormat::kLlama3Json, "llama3_json"},
}};

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
    found = {xml_call_end(buf, format_ == ToolCallFormat::kGlm45, tools_), 0};
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
