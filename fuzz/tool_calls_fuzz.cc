// libFuzzer target for the tool-call parsers (chat/tool_calls.h): any model text, in any
// format, must parse without a crash, sanitizer report, hang or exception, and feeding it in
// pieces must give exactly what parsing it whole gives (the streaming contract).
// Input: byte 0 picks the format, byte 1 picks the chunk-size seed, the rest is the text. The
// chunk sizes come from the seed (so each input always splits the same way), from 1 to 16 bytes.
// A fixed tools list types the XML formats' values.
//
//   ./tool_calls_fuzz -dict=fuzz/tool_calls.dict -max_len=4096 /tmp/tool_calls_corpus
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "chat/tool_calls.h"

namespace {

using metrale::chat::ToolCallDelta;
using metrale::chat::ToolCallFormat;
using metrale::chat::ToolCallParser;

const nlohmann::json& tools() {
  static const nlohmann::json kTools = nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"s": {"type": "string"}, "n": {"type": "integer"}, "l": {"type": ["string"]}}}}}])");
  return kTools;
}

void add(ToolCallDelta& all, ToolCallDelta d) {
  all.content += d.content;
  for (auto& c : d.calls) all.calls.push_back(std::move(c));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const auto format = static_cast<ToolCallFormat>(data[0] % 7);
  uint32_t seed = data[1] | 1u;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  const ToolCallDelta whole = ToolCallParser::parse(format, text, tools());
  ToolCallParser p(format, tools());
  ToolCallDelta streamed;
  int64_t calls = 0;
  for (size_t at = 0; at < text.size();) {
    seed = seed * 1103515245u + 12345u;
    const size_t n = 1 + (seed >> 16) % 16;
    ToolCallDelta d = p.feed(text.substr(at, n));
    calls += static_cast<int64_t>(d.calls.size());
    add(streamed, std::move(d));
    at += n;
  }
  ToolCallDelta last = p.finish();
  calls += static_cast<int64_t>(last.calls.size());
  add(streamed, std::move(last));
  if (streamed.content != whole.content || streamed.calls != whole.calls) {
    std::fprintf(stderr,
                 "streamed != whole parse\nwhole content:    [%s]\nstreamed content: [%s]\n",
                 whole.content.c_str(), streamed.content.c_str());
    std::abort();
  }
  for (const auto& c : whole.calls) {  // arguments are always a JSON object's text
    if (c.name.empty() || c.arguments.empty() || c.arguments.front() != '{') std::abort();
    const auto j = nlohmann::json::parse(c.arguments, nullptr, false);
    if (j.is_discarded() || !j.is_object()) std::abort();
  }
  if (p.calls_seen() != calls) std::abort();
  return 0;
}
