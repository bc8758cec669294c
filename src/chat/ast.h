#pragma once
// The parsed template: one node type for statements and expressions, its meaning by kind.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/lexer.h"
#include "chat/value.h"

namespace metrale::chat {

enum class NodeKind : uint8_t {
  // expressions
  kLiteral,    // value
  kName,       // name
  kList,       // args: items (a tuple when name is "tuple")
  kDict,       // args: key, value, key, value, ...
  kAttribute,  // args[0].name
  kItem,       // args[0][args[1]]
  kSlice,      // args[0][args[1]:args[2]:args[3]] (null where absent)
  kCall,       // args[0](args[1..], kwargs)
  kFilter,     // args[0] | name(args[1..], kwargs)
  kTest,       // args[0] is [not] name(args[1..]); negate
  kUnary,      // name ("-", "+", "not") args[0]
  kBinary,     // args[0] name args[1]: + - * / // % ** ~ and or
  kCompare,    // args[0] ops[0] args[1] ops[1] args[2] ... (chained, as Python)
  kCondition,  // args[1] if args[0] else args[2] (args[2] null: undefined)
  // statements
  kText,       // name: the data
  kOutput,     // {{ args[0] }}
  kIf,         // args[0]; body; else_body (an elif is an If inside else_body)
  kFor,        // targets in args[0] [if args[1]]; body; else_body
  kSet,        // targets = args[0], or name.attr = args[0] when attr is set
  kSetBlock,   // {% set name %}body{% endset %}
  kMacro,      // name(targets, defaults in args: null where none); body
  kCallBlock,  // {% call(targets) args[0] %}body{% endcall %}
  kBreak,
  kContinue,
  kGeneration,   // transformers' {% generation %}: renders its body
  kFilterBlock,  // {% filter name %}body{% endfilter %}: args[0] is a kFilter over a placeholder
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeKind kind;
  SourcePos pos;
  std::string name;
  std::string attr;
  Value value;
  bool negate = false;
  std::vector<NodePtr> args;
  std::vector<std::pair<std::string, NodePtr>> kwargs;
  std::vector<std::string> ops;
  std::vector<std::string> targets;
  std::vector<NodePtr> body;
  std::vector<NodePtr> else_body;
};

inline NodePtr make_node(NodeKind kind, SourcePos pos) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->pos = pos;
  return n;
}

}  // namespace metrale::chat
