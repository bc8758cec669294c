#pragma once
// Tool calls in a model's output: the text a chat model writes when it calls a function,
// parsed into OpenAI's tool_calls (a name and the arguments as JSON text), incrementally so a
// server can stream them. One parser per format the chat templates in tests/data/chat_templates
// teach their models (the names are vLLM's --tool-call-parser names):
//
//   hermes       Qwen2.5, Qwen3, Hermes:   <tool_call>{"name": N, "arguments": {...}}</tool_call>
//   qwen3_coder  Qwen3-Coder, Qwen3.5:     <tool_call><function=N><parameter=K>V</parameter>...
//                                          </function></tool_call>  (newlines around each part)
//   glm45        GLM-4.5 / 4.6 / 4.7:      <tool_call>N<arg_key>K</arg_key><arg_value>V
//                                          </arg_value>...</tool_call>  (newlines optional)
//   deepseek_v3  DeepSeek-V3 / R1:         <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
//                                          <｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>
//                                          ...<｜tool▁calls▁end｜>
//                DeepSeek-V3.1:            ...<｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}
//                                          <｜tool▁call▁end｜>...
//   mistral      Mistral Nemo (v3):        [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]
//                Mistral Small 3.2 (v11):  [TOOL_CALLS]N[CALL_ID]id[ARGS]{...} (repeated)
//   llama3_json  Llama 3.1 / 3.2 / 3.3:    {"name": N, "parameters": {...}} as the whole reply,
//                                          optionally after <|python_tag|>; several joined by ";"
//
// Semantics (as vLLM's parsers, where they agree with each other):
// - Text outside the calls is content. Whitespace between and after calls is dropped; other
//   text there is kept as content, never lost.
// - A call that does not parse (bad JSON, no name, arguments that are not an object) is
//   returned as content, verbatim, markers included: a malformed call is never dropped and
//   never half-reported.
// - Arguments are always a JSON object's text. In the XML-like formats (qwen3_coder, glm45)
//   values are text: a value whose parameter the request's tool schema types as "string"
//   (or that the schema does not know and that is not valid JSON) stays a string, any other
//   is read as JSON (numbers, booleans, objects, arrays, null), falling back to the string.
// - Streaming: feed() returns content as soon as it cannot be the start of a call marker, and
//   each call whole once its end is seen (one delta per call: name and complete arguments).
//   The concatenation of every delta's content, and the calls in order, equal what parsing
//   the whole text at once gives, whatever the split of the text into feed() calls.
// - finish() ends the text: a call still open (its end marker never came, e.g. max_tokens or
//   an eos right after the arguments) is parsed if what it holds is complete, else returned
//   as content.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace metrale::chat {

enum class ToolCallFormat : uint8_t {
  kNone,  // no parsing: the whole output is content
  kHermes,
  kQwen3Coder,
  kGlm45,
  kDeepSeekV3,
  kMistral,
  kLlama3Json,
};

// "none", "hermes", "qwen3_coder", "glm45", "deepseek_v3", "mistral", "llama3_json".
std::string_view tool_call_format_name(ToolCallFormat f);
// The inverse; an Error naming the valid names for anything else.
ToolCallFormat tool_call_format_from_name(std::string_view name);
// The format a chat template teaches, from the markers its source renders (kNone when it
// renders no tool calls the parsers know).
ToolCallFormat detect_tool_call_format(std::string_view template_source);
// Where one format's templates write a call two ways (the parser reads both), the way a
// template writes it: what a forced call (tool_choice) is written as.
enum class ToolCallSpelling : uint8_t {
  kDefault,  // hermes..., deepseek_v3: V3's function<｜tool▁sep｜>N```json, mistral: Nemo's list
  kDeepSeekV31,  // DeepSeek-V3.1: N<｜tool▁sep｜>{...}
  kMistralArgs,  // Mistral Small 3.2 (v11): [TOOL_CALLS]N[ARGS]{...}
};
ToolCallSpelling detect_tool_call_spelling(ToolCallFormat f, std::string_view template_source);
// Whether the format's markers are special tokens in its models' tokenizers (Mistral's
// [TOOL_CALLS], Llama's <|python_tag|>): a server must then decode without skipping special
// tokens for the parser to see them.
bool tool_call_markers_are_special(ToolCallFormat f);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text, e.g. {"city": "Paris"}
  std::string id;         // the id the model wrote (Mistral v11's [CALL_ID]); usually ""

  bool operator==(const ToolCall&) const = default;
};

struct ToolCallDelta {
  std::string content;          // text to show as content, in order
  std::vector<ToolCall> calls;  // calls completed by this piece of text, in order
  bool empty() const { return content.empty() && calls.empty(); }
};

class ToolCallParser {
 public:
  // `tools`: the request's tools list (OpenAI's [{"type": "function", "function": {"name",
  // "parameters": JSON schema}}]) or null; it types the XML formats' parameter values.
  explicit ToolCallParser(ToolCallFormat format, const nlohmann::json& tools = nlohmann::json());

  // The next piece of the model's text (any split, even inside a UTF-8 character).
  ToolCallDelta feed(std::string_view text);
  // The end of the text: whatever was held back, resolved.
  ToolCallDelta finish();

  // Parses a whole text at once (feed + finish).
  static ToolCallDelta parse(ToolCallFormat format, std::string_view text,
                             const nlohmann::json& tools = nlohmann::json());

  ToolCallFormat format() const { return format_; }
  int64_t calls_seen() const { return calls_seen_; }

 private:
  enum class Mode : uint8_t {
    kContent,  // outside calls: content flows, a possible start marker is held
    kCall,     // inside a call (or, for mistral / llama3_json, the held rest of the text)
    kBlock,  // deepseek_v3: inside <｜tool▁calls▁begin｜> ... <｜tool▁calls▁end｜>, between calls
  };

  void step(ToolCallDelta& out, bool at_end);
  void step_content(ToolCallDelta& out, bool at_end);
  bool step_call(ToolCallDelta& out, bool at_end);  // false: wait for more text
  void step_block(ToolCallDelta& out, bool at_end);
  void step_llama_start(ToolCallDelta& out, bool at_end);
  // Content outside calls: whitespace right after a call is held (dropped if a call or the
  // end follows, released with the next other text).
  void emit_content(ToolCallDelta& out, std::string_view text);
  // Content inside a deepseek block: the block's opening marker is released with it when no
  // call of the block parsed yet.
  void emit_block_content(ToolCallDelta& out, std::string_view text);
  void emit_call(ToolCallDelta& out, ToolCall call);
  // One call's text (start marker to end marker, or to the end of the text when `closed` is
  // false) -> the call, or nullopt when malformed.
  std::optional<ToolCall> parse_one(std::string_view call_text, bool closed) const;
  void finish_rest(ToolCallDelta& out, std::string_view rest);  // mistral, llama3_json

  ToolCallFormat format_;
  nlohmann::json tools_;
  std::string buffer_;         // text held back: a possible start marker, or an open call
  std::string pending_;        // whitespace after a call, held
  std::string block_pending_;  // deepseek: the block's opening marker (and whitespace), held
  Mode mode_ = Mode::kContent;
  bool after_call_ = false;  // the last thing out was a call (its trailing whitespace is held)
  bool block_has_call_ = false;
  bool at_start_ = true;  // nothing but whitespace seen yet (llama3_json)
  size_t scan_ = 0;       // in a call: where the search for its end marker resumes
  int64_t calls_seen_ = 0;
};

}  // namespace metrale::chat
