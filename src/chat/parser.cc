#include "chat/parser.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <string_view>

#include "core/error.h"

namespace metrale::chat {
namespace {

bool one_of(std::string_view s, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), s) != names.end();
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& source)
      : t_(tokens), source_(source) {}

  std::vector<NodePtr> run() {
    std::vector<NodePtr> body = parse_body({});
    return body;
  }

 private:
  // ---- token helpers
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& tok = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return tok;
  }
  bool is_op(std::string_view op) const {
    return cur().kind == TokenKind::kOperator && cur().text == op;
  }
  bool is_name(std::string_view name) const {
    return cur().kind == TokenKind::kName && cur().text == name;
  }

  static std::string describe(const Token& tok) {
    switch (tok.kind) {
      case TokenKind::kText:
        return "template data";
      case TokenKind::kVarBegin:
        return "'{{'";
      case TokenKind::kVarEnd:
        return "'}}'";
      case TokenKind::kBlockBegin:
        return "'{%'";
      case TokenKind::kBlockEnd:
        return "'%}'";
      case TokenKind::kName:
        return "'" + tok.text + "'";
      case TokenKind::kString:
        return "a string";
      case TokenKind::kInt:
      case TokenKind::kFloat:
        return "number " + tok.text;
      case TokenKind::kOperator:
        return "'" + tok.text + "'";
      case TokenKind::kEnd:
        return "the end of the template";
    }
    return "?";
  }

  template <typename... Args>
  [[noreturn]] void fail(SourcePos pos, Args&&... what) const {
    throw make_error(source_, ":", pos.line, ":", pos.column, ": ", std::forward<Args>(what)...);
  }
  [[noreturn]] void unexpected(std::string_view expected) const {
    fail(cur().pos, "expected ", expected, ", found ", describe(cur()));
  }
  void expect_op(std::string_view op) {
    if (!is_op(op)) unexpected("'" + std::string(op) + "'");
    next();
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::kBlockEnd) unexpected("'%}'");
    next();
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::kName) unexpected("a name");
    return next().text;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxParseDepth) {
        p_.fail(p_.cur().pos, "nesting deeper than ", kMaxParseDepth, " levels");
      }
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  // ---- statements
  // Parses until a block tag whose name is in `ends` (left unconsumed: the caller reads it)
  // or, when `ends` is empty, the end of the template.
  std::vector<NodePtr> parse_body(std::initializer_list<std::string_view> ends) {
    DepthGuard guard(*this);
    std::vector<NodePtr> body;
    while (true) {
      const Token& tok = cur();
      if (tok.kind == TokenKind::kEnd) {
        if (ends.size() == 0) return body;
        std::string expected;
        for (std::string_view e : ends)
          expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
        fail(tok.pos, "unexpected end of template, expected ", expected);
      }
      if (tok.kind == TokenKind::kText) {
        auto n = make_node(NodeKind::kText, tok.pos);
        n->name = tok.text;
        body.push_back(std::move(n));
        next();
      } else if (tok.kind == TokenKind::kVarBegin) {
        auto n = make_node(NodeKind::kOutput, tok.pos);
        next();
        n->args.push_back(parse_expression());
        if (cur().kind != TokenKind::kVarEnd) unexpected("'}}'");
        next();
        body.push_back(std::move(n));
      } else if (tok.kind == TokenKind::kBlockBegin) {
        const Token& kw = peek();
        if (kw.kind == TokenKind::kName && one_of(kw.text, ends)) return body;
        next();
        body.push_back(parse_statement());
      } else {
        unexpected("template data or a tag");
      }
    }
  }

  // Consumes "{% name %}".
  void end_tag(std::string_view name) {
    next();  // {%
    if (!is_name(name)) unexpected("'" + std::string(name) + "'");
    next();
    expect_block_end();
  }

  NodePtr parse_statement() {
    const Token& kw = cur();
    if (kw.kind != TokenKind::kName) unexpected("a statement name");
    const std::string name = kw.text;
    const SourcePos pos = kw.pos;
    next();
    if (name == "if") return parse_if(pos);
    if (name == "for") return parse_for(pos);
    if (name == "set") return parse_set(pos);
    if (name == "macro") return parse_macro(pos);
    if (name == "call") return parse_call_block(pos);
    if (name == "filter") return parse_filter_block(pos);
    if (name == "break" || name == "continue") {
      expect_block_end();
      return make_node(name == "break" ? NodeKind::kBreak : NodeKind::kContinue, pos);
    }
    if (name == "generation") {
      expect_block_end();
      auto n = make_node(NodeKind::kGeneration, pos);
      n->body = parse_body({"endgeneration"});
      end_tag("endgeneration");
      return n;
    }
    if (one_of(name, {"include", "extends", "import", "from", "block", "raw", "with", "do",
                      "autoescape", "trans"})) {
      fail(pos, "unsupported tag '{% ", name, " %}' (chat templates are rendered on their own)");
    }
    fail(pos, "unknown tag '{% ", name, " %}'");
  }

  NodePtr parse_if(SourcePos pos) {
    auto n = make_node(NodeKind::kIf, pos);
    n->args.push_back(parse_expression());
    expect_block_end();
    n->body = parse_body({"elif", "else", "endif"});
    const Token& tag = peek();
    if (tag.text == "elif") {
      next();                                     // {%
      next();                                     // elif
      n->else_body.push_back(parse_if(tag.pos));  // consumes through endif
      return n;
    }
    if (tag.text == "else") {
      next();
      next();
      expect_block_end();
      n->else_body = parse_body({"endif"});
    }
    end_tag("endif");
    return n;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> targets{expect_name()};
    while (is_op(",")) {
      next();
      targets.push_back(expect_name());
    }
    return targets;
  }

  NodePtr parse_for(SourcePos pos) {
    auto n = make_node(NodeKind::kFor, pos);
    if (is_op("(")) fail(cur().pos, "parenthesised loop targets are not supported");
    n->targets = parse_targets();
    if (!is_name("in")) unexpected("'in'");
    next();
    n->args.push_back(parse_expression(/*with_condition=*/false));
    if (is_name("if")) {
      next();
      n->args.push_back(parse_expression());
    }
    if (is_name("recursive")) fail(cur().pos, "unsupported: recursive loops");
    expect_block_end();
    n->body = parse_body({"endfor", "else"});
    if (peek().text == "else") {
      next();
      next();
      expect_block_end();
      n->else_body = parse_body({"endfor"});
    }
    end_tag("endfor");
    return n;
  }

  NodePtr parse_set(SourcePos pos) {
    const std::string first = expect_name();
    if (is_op(".")) {
      next();
      auto n = make_node(NodeKind::kSet, pos);
      n->name = first;
      n->attr = expect_name();
      expect_op("=");
      n->args.push_back(parse_expression());
      expect_block_end();
      return n;
    }
    if (cur().kind == TokenKind::kBlockEnd) {
      next();
      auto n = make_node(NodeKind::kSetBlock, pos);
      n->name = first;
      n->body = parse_body({"endset"});
      end_tag("endset");
      return n;
    }
    if (is_op("|")) fail(cur().pos, "unsupported: filters on a block set");
    auto n = make_node(NodeKind::kSet, pos);
    n->targets.push_back(first);
    while (is_op(",")) {
      next();
      n->targets.push_back(expect_name());
    }
    expect_op("=");
    n->args.push_back(parse_expression());
    expect_block_end();
    return n;
  }

  // "(a, b=default, ...)" into targets and args (null where no default).
  void parse_params(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.targets.empty()) expect_op(",");
      if (is_op(")")) break;
      n.targets.push_back(expect_name());
      if (is_op("=")) {
        next();
        n.args.push_back(parse_expression());
      } else {
        n.args.push_back(nullptr);
      }
    }
    next();
  }

  NodePtr parse_macro(SourcePos pos) {
    auto n = make_node(NodeKind::kMacro, pos);
    n->name = expect_name();
    parse_params(*n);
    expect_block_end();
    n->body = parse_body({"endmacro"});
    end_tag("endmacro");
    return n;
  }

  NodePtr parse_call_block(SourcePos pos) {
    auto n = make_node(NodeKind::kCallBlock, pos);
    auto params = make_node(NodeKind::kList, pos);  // the caller's parameters and defaults
    if (is_op("(")) parse_params(*params);
    NodePtr call = parse_expression();
    if (call->kind != NodeKind::kCall) fail(call->pos, "expected a macro call after '{% call %}'");
    n->targets = std::move(params->targets);
    n->args.push_back(std::move(call));
    for (NodePtr& d : params->args) n->args.push_back(std::move(d));
    expect_block_end();
    n->body = parse_body({"endcall"});
    end_tag("endcall");
    return n;
  }

  NodePtr parse_filter_block(SourcePos pos) {
    auto n = make_node(NodeKind::kFilterBlock, pos);
    auto placeholder = make_node(NodeKind::kLiteral, pos);
    n->args.push_back(parse_filter(std::move(placeholder)));
    expect_block_end();
    n->body = parse_body({"endfilter"});
    end_tag("endfilter");
    return n;
  }

  // ---- expressions
  NodePtr parse_expression(bool with_condition = true) {
    DepthGuard guard(*this);
    NodePtr e = parse_or();
    if (!with_condition) return e;
    while (is_name("if")) {
      const SourcePos pos = cur().pos;
      next();
      auto n = make_node(NodeKind::kCondition, pos);
      n->args.push_back(parse_or());
      n->args.push_back(std::move(e));
      if (is_name("else")) {
        next();
        n->args.push_back(parse_expression());
      } else {
        n->args.push_back(nullptr);
      }
      e = std::move(n);
    }
    return e;
  }

  NodePtr binary(std::string op, NodePtr a, NodePtr b, SourcePos pos) {
    auto n = make_node(NodeKind::kBinary, pos);
    n->name = std::move(op);
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(b));
    return n;
  }

  NodePtr parse_or() {
    NodePtr e = parse_and();
    while (is_name("or")) {
      const SourcePos pos = next().pos;
      e = binary("or", std::move(e), parse_and(), pos);
    }
    return e;
  }
  NodePtr parse_and() {
    NodePtr e = parse_not();
    while (is_name("and")) {
      const SourcePos pos = next().pos;
      e = binary("and", std::move(e), parse_not(), pos);
    }
    return e;
  }
  NodePtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto n = make_node(NodeKind::kUnary, next().pos);
      n->name = "not";
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  NodePtr parse_compare() {
    NodePtr first = parse_math1();
    NodePtr n;
    while (true) {
      std::string op;
      const SourcePos pos = cur().pos;
      if (cur().kind == TokenKind::kOperator &&
          one_of(cur().text, {"==", "!=", "<", ">", "<=", ">="})) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!n) {
        n = make_node(NodeKind::kCompare, pos);
        n->args.push_back(std::move(first));
      }
      n->ops.push_back(op);
      n->args.push_back(parse_math1());
    }
    return n ? std::move(n) : std::move(first);
  }
  NodePtr parse_math1() {
    NodePtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(op.text, std::move(e), parse_concat(), op.pos);
    }
    return e;
  }
  NodePtr parse_concat() {
    NodePtr e = parse_math2();
    while (is_op("~")) {
      const SourcePos pos = next().pos;
      e = binary("~", std::move(e), parse_math2(), pos);
    }
    return e;
  }
  NodePtr parse_math2() {
    NodePtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(op.text, std::move(e), parse_pow(), op.pos);
    }
    return e;
  }
  NodePtr parse_pow() {
    NodePtr e = parse_unary(true);
    while (is_op("**")) {
      const SourcePos pos = next().pos;
      e = binary("**", std::move(e), parse_unary(true), pos);
    }
    return e;
  }
  NodePtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    NodePtr e;
    if (is_op("-") || is_op("+")) {
      e = make_node(NodeKind::kUnary, cur().pos);
      e->name = next().text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  NodePtr literal(Value v, SourcePos pos) {
    auto n = make_node(NodeKind::kLiteral, pos);
    n->value = std::move(v);
    return n;
  }

  NodePtr parse_primary() {
    const Token& tok = cur();
    const SourcePos pos = tok.pos;
    switch (tok.kind) {
      case TokenKind::kName: {
        next();
        if (tok.text == "true" || tok.text == "True") return literal(Value(true), pos);
        if (tok.text == "false" || tok.text == "False") return literal(Value(false), pos);
        if (tok.text == "none" || tok.text == "None") return literal(Value(None{}), pos);
        auto n = make_node(NodeKind::kName, pos);
        n->name = tok.text;
        return n;
      }
      case TokenKind::kString: {
        std::string s = next().text;
        while (cur().kind == TokenKind::kString) s += next().text;  // "a" "b" is "ab"
        return literal(Value(std::move(s)), pos);
      }
      case TokenKind::kInt: {
        int64_t v = 0;
        const std::string& text = next().text;
        const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
        if (res.ec != std::errc() || res.ptr != text.data() + text.size()) {
          fail(pos, "integer literal ", text, " is out of the supported range (int64)");
        }
        return literal(Value(v), pos);
      }
      case TokenKind::kFloat: {
        const double v = std::strtod(next().text.c_str(), nullptr);
        return literal(Value(v), pos);
      }
      case TokenKind::kOperator:
        if (tok.text == "(") {
          next();
          auto t = make_node(NodeKind::kList, pos);
          t->name = "tuple";
          if (is_op(")")) {
            next();
            return t;
          }
          NodePtr e = parse_expression();
          if (!is_op(",")) {
            expect_op(")");
            return e;
          }
          t->args.push_back(std::move(e));
          while (is_op(",")) {
            next();
            if (is_op(")")) break;
            t->args.push_back(parse_expression());
          }
          expect_op(")");
          return t;
        }
        if (tok.text == "[") {
          next();
          auto n = make_node(NodeKind::kList, pos);
          while (!is_op("]")) {
            if (!n->args.empty()) expect_op(",");
            if (is_op("]")) break;
            n->args.push_back(parse_expression());
          }
          next();
          return n;
        }
        if (tok.text == "{") {
          next();
          auto n = make_node(NodeKind::kDict, pos);
          while (!is_op("}")) {
            if (!n->args.empty()) expect_op(",");
            if (is_op("}")) break;
            n->args.push_back(parse_expression());
            expect_op(":");
            n->args.push_back(parse_expression());
          }
          next();
          return n;
        }
        break;
      default:
        break;
    }
    unexpected("an expression");
  }

  NodePtr parse_postfix(NodePtr e) {
    while (true) {
      const SourcePos pos = cur().pos;
      if (is_op(".")) {
        next();
        if (cur().kind == TokenKind::kInt) {
          auto n = make_node(NodeKind::kItem, pos);
          n->args.push_back(std::move(e));
          n->args.push_back(parse_primary());
          e = std::move(n);
        } else {
          auto n = make_node(NodeKind::kAttribute, pos);
          n->args.push_back(std::move(e));
          n->name = expect_name();
          e = std::move(n);
        }
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), pos);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  NodePtr parse_subscript(NodePtr e, SourcePos pos) {
    NodePtr parts[3];
    bool slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = parse_expression();
      if (k < 2 && is_op(":")) {
        next();
        slice = true;
      } else {
        break;
      }
    }
    if (is_op(",")) fail(cur().pos, "unsupported: tuple subscripts");
    expect_op("]");
    if (!slice) {
      if (!parts[0]) fail(pos, "empty subscript");
      auto n = make_node(NodeKind::kItem, pos);
      n->args.push_back(std::move(e));
      n->args.push_back(std::move(parts[0]));
      return n;
    }
    auto n = make_node(NodeKind::kSlice, pos);
    n->args.push_back(std::move(e));
    for (NodePtr& p : parts) n->args.push_back(std::move(p));
    return n;
  }

  // "(args)" after `callee` (or the arguments of a filter or test: callee becomes args[0]).
  void parse_args(Node& n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur().pos, "unsupported: *args / **kwargs in a call");
      if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOperator &&
          peek().text == "=") {
        std::string key = next().text;
        next();
        n.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!n.kwargs.empty()) fail(cur().pos, "positional argument follows keyword argument");
        n.args.push_back(parse_expression());
      }
    }
    next();
  }

  NodePtr parse_call(NodePtr callee) {
    auto n = make_node(NodeKind::kCall, callee->pos);  // where the callee is named
    n->args.push_back(std::move(callee));
    parse_args(*n);
    return n;
  }

  NodePtr parse_filter(NodePtr subject) {
    auto n = make_node(NodeKind::kFilter, cur().pos);
    n->name = expect_name();
    while (is_op(".")) {
      next();
      n->name += "." + expect_name();
    }
    n->args.push_back(std::move(subject));
    if (is_op("(")) parse_args(*n);
    return n;
  }

  NodePtr parse_filter_expr(NodePtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        auto n = make_node(NodeKind::kTest, next().pos);
        if (is_name("not")) {
          next();
          n->negate = true;
        }
        n->name = expect_name();
        n->args.push_back(std::move(e));
        const Token& tok = cur();
        if (is_op("(")) {
          parse_args(*n);
        } else if ((tok.kind == TokenKind::kName && !one_of(tok.text, {"else", "or", "and"})) ||
                   tok.kind == TokenKind::kString || tok.kind == TokenKind::kInt ||
                   tok.kind == TokenKind::kFloat || is_op("[") || is_op("{")) {
          n->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const std::string& source_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

std::vector<NodePtr> parse_template(const std::vector<Token>& tokens,
                                    const std::string& source_name) {
  return Parser(tokens, source_name).run();
}

}  // namespace metrale::chat
