#pragma once
// Template source -> tokens, with jinja2's whitespace rules as transformers configures them
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False): a block or comment tag
// eats one newline after it; spaces and tabs before a block or comment tag that starts its
// line are dropped; `-` inside a tag strips all whitespace on that side, `+` keeps it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace metrale::chat {

struct SourcePos {
  int32_t line = 1;
  int32_t column = 1;  // 1-based, in bytes
};

enum class TokenKind : uint8_t {
  kText,        // template data between tags (already whitespace-controlled)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // text holds the unescaped value
  kInt,
  kFloat,
  kOperator,  // text holds the operator: "+", "//", "==", "(", "|", ...
  kEnd,
};

struct Token {
  TokenKind kind;
  std::string text;
  SourcePos pos;
};

// Throws metrale::Error "<source>:<line>:<col>: ..." on an unterminated tag, string or comment,
// an unknown character, or a bracket that does not match.
std::vector<Token> tokenize(std::string_view source_text, const std::string& source_name);

}  // namespace metrale::chat
