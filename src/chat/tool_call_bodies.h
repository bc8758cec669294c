#pragma once
// The pieces of chat/tool_calls.cc's parser that read one call's text (or a JSON value in it):
// the formats' markers, text and JSON helpers, and each format's call body. Internal to the chat
// module; tool_calls.h is its interface.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat/tool_calls.h"

namespace metrale::chat::detail {

inline constexpr size_t kNpos = std::string_view::npos;

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";
inline constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
inline constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
inline constexpr std::string_view kMistralCallId = "[CALL_ID]";
inline constexpr std::string_view kMistralArgs = "[ARGS]";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";

bool all_space(std::string_view s);
std::string_view ltrim(std::string_view s);
std::string_view trim(std::string_view s);
bool starts_with(std::string_view s, std::string_view p);

// Scans JSON-ish text outside strings. Returns the index past the bracket that closes the
// value `s` starts with ('{' or '['), or kNpos when it never closes or nests too deep. With
// `whole`, scans all of `s` and returns 0 when the nesting stays within the limit (kNpos
// otherwise).
size_t scan_brackets(std::string_view s, bool whole);
// Strict JSON, never throwing; nullopt for anything malformed or nested too deep.
std::optional<nlohmann::ordered_json> parse_json(std::string_view s);
// {"name": N, "arguments" (or "parameters"): {...}} -> a call (with take_id, its "id" too).
std::optional<ToolCall> call_from_object(const nlohmann::ordered_json& o, bool take_id);
// Arguments written as a JSON object, or as a string holding one: the compact object text.
std::optional<std::string> arguments_text(std::string_view s);
// Where a value that starts at `from` ends: the first `marker` past it, or with `json` the first
// outside its JSON strings (tool_call_bodies.cc); kNpos: not (yet) there.
size_t value_end(std::string_view s, size_t from, std::string_view marker, bool json);

// Where an XML-format call's end marker is in `buf` (which starts with <tool_call>), past every
// parameter value; kNpos: not (yet) there. glm45 when `glm`, else qwen3_coder.
size_t xml_call_end(std::string_view buf, bool glm, const nlohmann::json& tools);
std::optional<ToolCall> parse_qwen3_coder(std::string_view body, const nlohmann::json& tools);
std::optional<ToolCall> parse_glm45(std::string_view body, bool closed,
                                    const nlohmann::json& tools);
std::optional<ToolCall> parse_deepseek(std::string_view body);

}  // namespace metrale::chat::detail
