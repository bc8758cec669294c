#pragma once
// Tokens -> the template's statement list. Covers the jinja2 grammar chat templates use;
// anything else (include, extends, import, raw, recursive loops, *args) is an Error naming the
// source, line:column and the construct.
#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"

namespace metrale::chat {

// Nesting of expressions and blocks beyond this is refused (the parser and evaluator recurse).
inline constexpr int kMaxParseDepth = 128;

std::vector<NodePtr> parse_template(const std::vector<Token>& tokens,
                                    const std::string& source_name);

}  // namespace metrale::chat
