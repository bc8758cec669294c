// libFuzzer target for chat templates: any bytes must parse and render to a string or a
// metrale::Error, never a crash, sanitizer report, hang, leak or runaway allocation.
// The input is a template; if it holds a NUL byte, what follows is the request JSON
// (messages, tools, add_generation_prompt, chat_template_kwargs), else a fixed request with
// a system prompt, tools, a tool-call round, content parts and reasoning is rendered.
// Limits are tightened so a fuzzed loop stops quickly.
//
// Seeds: fuzz/corpus/chat_template_fuzz/ (the real templates of tests/data/chat_templates/), e.g.
//   ./chat_template_fuzz -dict=fuzz/chat_template.dict -max_len=16384 /tmp/chat_corpus
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "chat/chat_template.h"
#include "core/error.h"

namespace {

constexpr std::string_view kRequest = R"({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Z\u00fcrich?"}, {"type": "image"}]},
    {"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
     "tool_calls": [{"id": "call12345", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Z\u00fcrich", "days": 2}}}]},
    {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "<think>\nok\n</think>\n\nIt is 21 \u00b0C."},
    {"role": "user", "content": "Thanks"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}}],
  "add_generation_prompt": true,
  "chat_template_kwargs": {"enable_thinking": false}
})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);
  metrale::chat::RenderOptions options;
  options.limits.max_steps = 20000;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_call_depth = 32;
  options.limits.max_work_bytes = 64 << 20;
  options.now = [] {
    std::tm t{};
    t.tm_year = 126;
    t.tm_mday = 1;
    return t;
  };
  try {
    // The fixed request is parsed once; a request given after the NUL is parsed every time.
    static const metrale::chat::ChatRequest kFixed =
        metrale::chat::ChatRequest::from_json(kRequest, "fuzz/request.json");
    const metrale::chat::ChatRequest parsed =
        nul == std::string_view::npos
            ? metrale::chat::ChatRequest{}
            : metrale::chat::ChatRequest::from_json(input.substr(nul + 1), "fuzz/request.json");
    const metrale::chat::ChatRequest& request = nul == std::string_view::npos ? kFixed : parsed;
    const metrale::chat::ChatTemplate t = metrale::chat::ChatTemplate::from_string(
        text, "fuzz/chat_template.jinja", {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    (void)t.render(request, options);
  } catch (const metrale::Error&) {
  }
  return 0;
}
