#pragma once
// Reasoning in a model's reply: the `<think>` ... `</think>` block that Qwen3, Qwen3.5,
// DeepSeek-R1 / V3.1 and GLM-4.5+ write before their answer, split from the answer so an
// OpenAI-style server can return it as `reasoning_content` (the DeepSeek API's name, which
// vLLM's and llama-server's reasoning parsers use) beside `content`.
//
// Where reasoning is:
// - The prompt ended inside an open block (the chat template's generation prompt ends with
//   `<think>`, as Qwen3.5's and DeepSeek-V3.1's do in thinking mode): the reply starts in
//   reasoning, up to `</think>`.
// - Otherwise a reply whose first non-whitespace text is `<think>` opens a block (Qwen3).
// - Anything else is all content.
// A block that never closes (max_tokens, or the model stopped) is all reasoning. After
// `</think>` the rest is content, its leading whitespace dropped; the reasoning has its
// leading and trailing newlines dropped, as the templates strip it when they render history.
//
// Incremental: feed() returns what is decided, holding back only what may still be the start
// of a marker (or trailing whitespace whose fate depends on what follows); any split of the
// reply gives, concatenated, what one parse of the whole gives.
#include <string>
#include <string_view>

namespace metrale::chat {

enum class ReasoningFormat : unsigned char {
  kNone,   // no splitting: all content
  kThink,  // <think> ... </think>
};

// "none", "think".
std::string_view reasoning_format_name(ReasoningFormat f);
// The inverse; an Error naming the valid names for anything else.
ReasoningFormat reasoning_format_from_name(std::string_view name);
// kThink when the template source renders `</think>`, else kNone.
ReasoningFormat detect_reasoning_format(std::string_view template_source);
// Whether a rendered prompt leaves the reply inside an open `<think>` block (the prompt ends
// with `<think>` and whitespace).
bool prompt_opens_reasoning(std::string_view rendered_prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // `starts_open`: prompt_opens_reasoning() of the prompt.
  ReasoningParser(ReasoningFormat format, bool starts_open);

  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();

  static ReasoningDelta parse(ReasoningFormat format, bool starts_open, std::string_view text);

 private:
  enum class State : unsigned char { kStart, kReasoning, kContent };
  ReasoningDelta step(bool at_end);

  State state_;
  std::string buffer_;            // text not yet decided
  bool reasoning_begun_ = false;  // some reasoning was released (leading newlines dropped)
  bool content_begun_ = false;    // some content was released (leading whitespace dropped)
  std::string pending_newlines_;  // reasoning's trailing newlines, released if more follows
};

}  // namespace metrale::chat
