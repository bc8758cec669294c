// Evaluates the parsed template: scopes as jinja2 has them (a for-loop iteration and a macro
// call get their own; if does not), Python semantics for operators, jinja2's Undefined.
#include <cmath>
#include <limits>
#include <unordered_map>

#include "chat/lexer.h"
#include "chat/parser.h"
#include "chat/pystr.h"
#include "chat/template.h"
#include "core/error.h"

namespace metrale::chat {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

[[noreturn]] void fail_undefined(const Value& v) { throw RenderFailure(v.undefined_hint()); }

std::string name_for_hint(const Value& v) {
  return v.is_dict() && !v.as_dict().is_namespace ? "dict object" : type_name(v) + " object";
}

// Byte offset of each character of `s`, then s.size().
std::vector<uint32_t> char_offsets(const std::string& s) {
  std::vector<uint32_t> offsets;
  uint32_t pos = 0;
  for_each_codepoint(s, [&](char32_t, std::string_view bytes) {
    offsets.push_back(pos);
    pos += static_cast<uint32_t>(bytes.size());
  });
  offsets.push_back(pos);
  return offsets;
}

int64_t as_index(const Value& v) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool() ? 1 : 0;
  throw RenderFailure("indices must be integers, not " + type_name(v));
}

class Interpreter {
 public:
  Interpreter(const std::string& source, const RenderOptions& options)
      : source_(source), limits_(options.limits) {}

  void exec_top(const std::vector<NodePtr>& body, const ScopePtr& scope, std::string& out) {
    const Flow f = exec_body(body, scope, out);
    (void)f;  // break/continue outside a loop are refused when they run (below)
  }

 private:
  // ---- errors and limits
  [[noreturn]] void fail_at(SourcePos pos, const std::string& what) const {
    throw make_error(source_, ":", pos.line, ":", pos.column, ": ", what);
  }
  void step(SourcePos pos) {
    if (++steps_ > limits_.max_steps) {
      fail_at(pos, "render stopped after " + std::to_string(limits_.max_steps) +
                       " loop iterations and macro calls (RenderLimits::max_steps)");
    }
  }
  void append(std::string& out, std::string_view s, SourcePos pos) {
    output_bytes_ += s.size();
    if (output_bytes_ > limits_.max_output_bytes) {
      fail_at(pos, "output larger than " + std::to_string(limits_.max_output_bytes) +
                       " bytes (RenderLimits::max_output_bytes)");
    }
    out += s;
  }
  void check_size(size_t n) const {
    if (n > limits_.max_output_bytes) {
      throw RenderFailure("value larger than " + std::to_string(limits_.max_output_bytes) +
                          " bytes (RenderLimits::max_output_bytes)");
    }
  }

  // ---- statements
  Flow exec_body(const std::vector<NodePtr>& body, const ScopePtr& scope, std::string& out) {
    for (const NodePtr& n : body) {
      const Flow f = exec(*n, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& n, const ScopePtr& scope, std::string& out) {
    try {
      return exec_inner(n, scope, out);
    } catch (const RenderFailure& f) {
      fail_at(n.pos, f.message());
    }
  }

  Flow exec_inner(const Node& n, const ScopePtr& scope, std::string& out) {
    switch (n.kind) {
      case NodeKind::kText:
        append(out, n.name, n.pos);
        return Flow::kNormal;
      case NodeKind::kOutput:
        append(out, str_of(eval(*n.args[0], scope), limits_.max_output_bytes), n.pos);
        return Flow::kNormal;
      case NodeKind::kIf:
        return exec_body(truthy(eval(*n.args[0], scope)) ? n.body : n.else_body, scope, out);
      case NodeKind::kFor:
        return exec_for(n, scope, out);
      case NodeKind::kSet:
        exec_set(n, scope);
        return Flow::kNormal;
      case NodeKind::kSetBlock: {
        std::string text;
        exec_body(n.body, scope, text);
        scope->vars[n.name] = Value(std::move(text));
        return Flow::kNormal;
      }
      case NodeKind::kMacro:
        scope->vars[n.name] = make_macro(n, n.name, 0, scope);
        return Flow::kNormal;
      case NodeKind::kCallBlock:
        append(out, str_of(call_block(n, scope), limits_.max_output_bytes), n.pos);
        return Flow::kNormal;
      case NodeKind::kFilterBlock: {
        std::string text;
        exec_body(n.body, scope, text);
        const Node& f = *n.args[0];
        CallArgs args = eval_args(f, scope, 1);
        append(out,
               str_of(apply_filter(f.name, Value(std::move(text)), args, limits_),
                      limits_.max_output_bytes),
               n.pos);
        return Flow::kNormal;
      }
      case NodeKind::kBreak:
      case NodeKind::kContinue:
        if (loop_depth_ == 0) fail_at(n.pos, "'break' / 'continue' outside a loop");
        return n.kind == NodeKind::kBreak ? Flow::kBreak : Flow::kContinue;
      case NodeKind::kGeneration:
        return exec_body(n.body, scope, out);
      default:
        fail_at(n.pos, "internal: an expression where a statement belongs");
    }
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    if (!v.is_list() && !v.is_string()) {
      throw RenderFailure("cannot unpack " + type_name(v) + " into " +
                          std::to_string(targets.size()) + " names");
    }
    const List items = iterate(v);
    if (items.size() != targets.size()) {
      throw RenderFailure("expected " + std::to_string(targets.size()) + " values to unpack, got " +
                          std::to_string(items.size()));
    }
    for (size_t i = 0; i < items.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  Flow exec_for(const Node& n, const ScopePtr& scope, std::string& out) {
    List all = iterate(eval(*n.args[0], scope));
    if (n.args.size() > 1) {  // {% for x in xs if cond %}: filtered before loop.length counts
      List kept;
      for (Value& item : all) {
        step(n.pos);
        auto s = std::make_shared<Scope>();
        s->parent = scope;
        bind_targets(n.targets, item, *s);
        if (truthy(eval(*n.args[1], s))) kept.push_back(std::move(item));
      }
      all = std::move(kept);
    }
    if (all.empty()) return exec_body(n.else_body, scope, out);
    const int64_t length = static_cast<int64_t>(all.size());
    ++loop_depth_;
    for (int64_t i = 0; i < length; ++i) {
      step(n.pos);
      auto s = std::make_shared<Scope>();
      s->parent = scope;
      Value loop = Value::dict();
      Dict& d = loop.as_dict();
      d.set("index0", Value(i));
      d.set("index", Value(i + 1));
      d.set("revindex0", Value(length - i - 1));
      d.set("revindex", Value(length - i));
      d.set("first", Value(i == 0));
      d.set("last", Value(i == length - 1));
      d.set("length", Value(length));
      d.set("depth", Value(1));
      d.set("depth0", Value(0));
      if (i > 0) d.set("previtem", all[static_cast<size_t>(i - 1)]);
      if (i + 1 < length) d.set("nextitem", all[static_cast<size_t>(i + 1)]);
      s->vars["loop"] = loop;
      bind_targets(n.targets, all[static_cast<size_t>(i)], *s);
      if (exec_body(n.body, s, out) == Flow::kBreak) break;
    }
    --loop_depth_;
    return Flow::kNormal;
  }

  void exec_set(const Node& n, const ScopePtr& scope) {
    Value v = eval(*n.args[0], scope);
    if (!n.attr.empty()) {
      const Value target = lookup(n.name, scope);
      if (!target.is_dict() || !target.as_dict().is_namespace) {
        throw RenderFailure("cannot assign attribute on non-namespace object");
      }
      target.as_dict().set(n.attr, std::move(v));
      return;
    }
    bind_targets(n.targets, v, *scope);
  }

  // ---- macros
  struct MacroParams {
    const Node* node;
    size_t first_default;  // index in node->args of the first parameter's default
  };

  Value make_macro(const Node& n, const std::string& name, size_t first_default,
                   const ScopePtr& scope) {
    auto fn = std::make_shared<Function>();
    fn->name = name;
    const Node* node = &n;
    // A weak reference: the scope holds the macro, and a strong one would leak the pair.
    std::weak_ptr<Scope> weak = scope;
    fn->call = [this, node, name, first_default, weak](CallArgs& args) -> Value {
      const ScopePtr defining = weak.lock();
      if (!defining)
        throw RenderFailure("macro '" + name + "' called outside the scope that defined it");
      return call_macro(*node, name, first_default, defining, args);
    };
    return Value(std::shared_ptr<const Function>(std::move(fn)));
  }

  Value call_macro(const Node& n, const std::string& name, size_t first_default,
                   const ScopePtr& defining, CallArgs& args) {
    step(n.pos);
    if (call_depth_ >= limits_.max_call_depth) {
      throw RenderFailure("macro calls nested deeper than " +
                          std::to_string(limits_.max_call_depth) +
                          " (RenderLimits::max_call_depth)");
    }
    if (args.positional.size() > n.targets.size()) {
      throw RenderFailure("macro '" + name + "' takes not more than " +
                          std::to_string(n.targets.size()) + " argument(s)");
    }
    auto s = std::make_shared<Scope>();
    s->parent = defining;
    std::vector<bool> bound(n.targets.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      s->vars[n.targets[i]] = args.positional[i];
      bound[i] = true;
    }
    for (auto& [key, value] : args.keyword) {
      size_t k = 0;
      while (k < n.targets.size() && n.targets[k] != key) ++k;
      if (k == n.targets.size()) {
        if (key == "caller") {
          s->vars["caller"] = value;
          continue;
        }
        throw RenderFailure("macro '" + name + "' takes no keyword argument '" + key + "'");
      }
      s->vars[key] = value;
      bound[k] = true;
    }
    for (size_t k = 0; k < n.targets.size(); ++k) {
      if (bound[k]) continue;
      const Node* d = n.args[first_default + k].get();
      s->vars[n.targets[k]] =
          d != nullptr ? eval(*d, s)
                       : Value::undefined("parameter '" + n.targets[k] + "' was not provided");
    }
    std::string out;
    ++call_depth_;
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    exec_body(n.body, s, out);
    loop_depth_ = saved_loops;
    --call_depth_;
    return Value(std::move(out));
  }

  Value call_block(const Node& n, const ScopePtr& scope) {
    const Node& call = *n.args[0];
    const Value callee = eval(*call.args[0], scope);
    if (!callee.is_callable()) throw RenderFailure("'{% call %}' needs a macro");
    CallArgs args = eval_args(call, scope, 1);
    args.keyword.emplace_back("caller", make_macro(n, "caller", 1, scope));
    return callee.as_function().call(args);
  }

  // ---- expressions
  Value lookup(const std::string& name, const ScopePtr& scope) const {
    for (const Scope* s = scope.get(); s != nullptr; s = s->parent.get()) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  CallArgs eval_args(const Node& n, const ScopePtr& scope, size_t first) {
    CallArgs args;
    for (size_t i = first; i < n.args.size(); ++i)
      args.positional.push_back(eval(*n.args[i], scope));
    for (const auto& [key, expr] : n.kwargs) args.keyword.emplace_back(key, eval(*expr, scope));
    return args;
  }

  Value eval(const Node& n, const ScopePtr& scope) {
    try {
      Value v = eval_inner(n, scope);
      // Values built anew are charged by size: a loop re-copying a big string or list is
      // bounded by RenderLimits::max_work_bytes, not only by its iteration count.
      if (n.kind == NodeKind::kBinary || n.kind == NodeKind::kFilter || n.kind == NodeKind::kCall ||
          n.kind == NodeKind::kSlice || n.kind == NodeKind::kList) {
        charge(v, n.pos);
      }
      return v;
    } catch (const RenderFailure& f) {
      fail_at(n.pos, f.message());
    }
  }

  void charge(const Value& v, SourcePos pos) {
    uint64_t bytes = 0;
    if (v.is_string()) bytes = v.as_string().size();
    if (v.is_list()) bytes = v.as_list().size() * sizeof(Value);
    if (v.is_dict()) bytes = v.as_dict().size() * (sizeof(Value) + 32);
    work_bytes_ += bytes;
    if (work_bytes_ > limits_.max_work_bytes) {
      fail_at(pos, "render stopped after building " + std::to_string(limits_.max_work_bytes) +
                       " bytes of values (RenderLimits::max_work_bytes)");
    }
  }

  Value get_attr(const Value& obj, const std::string& name) {
    if (obj.is_undefined()) fail_undefined(obj);
    if (obj.is_dict() && obj.as_dict().is_namespace) {
      if (const Value* v = obj.as_dict().find(name)) return *v;
    } else {
      // jinja2 tries the Python attribute first: d.items is the method, not a key "items".
      if (auto m = bound_method(obj, name, limits_)) return *m;
      if (obj.is_dict()) {
        if (const Value* v = obj.as_dict().find(name)) return *v;
      }
    }
    return Value::undefined("'" + name_for_hint(obj) + "' has no attribute '" + name + "'");
  }

  Value get_item(const Value& obj, const Value& key) {
    if (obj.is_undefined()) fail_undefined(obj);
    if (obj.is_dict()) {
      if (const Value* v = obj.as_dict().find(key)) return *v;
    } else if (obj.is_list() && obj.as_list().indexable() && (key.is_int() || key.is_bool())) {
      const List& seq = obj.as_list();
      int64_t i = as_index(key);
      const int64_t size = static_cast<int64_t>(seq.size());
      if (i < 0) i += size;
      if (i >= 0 && i < size) return seq[static_cast<size_t>(i)];
    } else if (obj.is_string() && (key.is_int() || key.is_bool())) {
      const std::vector<uint32_t> at = char_offsets(obj.as_string());
      int64_t i = as_index(key);
      const int64_t size = static_cast<int64_t>(at.size()) - 1;
      if (i < 0) i += size;
      if (i >= 0 && i < size) {
        const size_t k = static_cast<size_t>(i);
        return Value(obj.as_string().substr(at[k], at[k + 1] - at[k]));
      }
    }
    if (key.is_string()) {  // then jinja2 tries the attribute
      if (auto m = bound_method(obj, key.as_string(), limits_)) return *m;
    }
    return Value::undefined("'" + name_for_hint(obj) + "' has no attribute " + repr_of(key));
  }

  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& stride) {
    if (obj.is_undefined()) fail_undefined(obj);
    if ((!obj.is_list() && !obj.is_string()) || (obj.is_list() && !obj.as_list().indexable())) {
      throw RenderFailure("'" + type_name(obj) + "' object is not subscriptable");
    }
    const bool is_string = obj.is_string();
    const std::vector<uint32_t> at =
        is_string ? char_offsets(obj.as_string()) : std::vector<uint32_t>();
    const int64_t n = is_string ? static_cast<int64_t>(at.size()) - 1
                                : static_cast<int64_t>(obj.as_list().size());
    const auto opt = [](const Value& v) -> std::optional<int64_t> {
      if (v.is_undefined() || v.is_none()) return std::nullopt;
      return as_index(v);
    };
    const int64_t st = opt(stride).value_or(1);
    if (st == 0) throw RenderFailure("slice step cannot be zero");
    const auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v;
      if (x < 0) x += n;
      if (st > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t b = clamp(opt(start), st > 0 ? 0 : n - 1);
    const int64_t e = clamp(opt(stop), st > 0 ? n : -1);
    List out;
    std::string text;
    for (int64_t i = b; st > 0 ? i < e : i > e;) {
      const size_t k = static_cast<size_t>(i);
      if (is_string) {
        text.append(obj.as_string(), at[k], at[k + 1] - at[k]);
      } else {
        out.push_back(obj.as_list()[k]);
      }
      if (__builtin_add_overflow(i, st, &i)) break;
    }
    if (is_string) return Value(std::move(text));
    out.kind = obj.as_list().kind == SeqKind::kTuple ? SeqKind::kTuple : SeqKind::kList;
    return Value::list(std::move(out));
  }

  Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    if (a.is_number() && b.is_number()) {
      if (!a.is_float() && !b.is_float() && op != "/" && op != "**") {
        const int64_t x = a.is_int() ? a.as_int() : a.as_bool();
        const int64_t y = b.is_int() ? b.as_int() : b.as_bool();
        int64_t r = 0;
        bool overflow = false;
        if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
        if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
        if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
        if (op == "//" || op == "%") {
          if (y == 0) throw RenderFailure("integer division or modulo by zero");
          if (x == std::numeric_limits<int64_t>::min() && y == -1) {
            overflow = true;
          } else {
            int64_t q = x / y;
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
              --q;
              m += y;
            }
            r = op == "//" ? q : m;
          }
        }
        if (overflow) throw RenderFailure("integer overflow (beyond int64) in '" + op + "'");
        return Value(r);
      }
      const double x = to_double(a);
      const double y = to_double(b);
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") {
        if (!a.is_float() && !b.is_float() && y >= 0) {
          const double r = std::pow(x, y);
          if (std::fabs(r) > 9.2e18) throw RenderFailure("integer overflow (beyond int64) in '**'");
          return Value(static_cast<int64_t>(r));
        }
        return Value(std::pow(x, y));
      }
      if (y == 0) throw RenderFailure("division by zero");
      if (op == "/") return Value(x / y);
      const double q = std::floor(x / y);
      if (op == "//") return Value(q);
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
    if (op == "+" && a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {  // Markup.__add__ / __radd__ escape the plain side
        const std::string x = a.is_markup() ? a.as_string() : html_escape(a.as_string());
        const std::string y = b.is_markup() ? b.as_string() : html_escape(b.as_string());
        check_size(x.size() + y.size());
        return Value::markup(x + y);
      }
      check_size(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (op == "+" && a.is_list() && b.is_list() && a.as_list().kind == b.as_list().kind &&
        (a.as_list().kind == SeqKind::kList || a.as_list().is_tuple())) {
      List l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(l));
    }
    const auto repeatable = [](const Value& v) {
      return v.is_string() ||
             (v.is_list() && (v.as_list().kind == SeqKind::kList || v.as_list().is_tuple()));
    };
    if (op == "*" && repeatable(a) && (b.is_int() || b.is_bool())) return repeat(a, b);
    if (op == "*" && repeatable(b) && (a.is_int() || a.is_bool())) return repeat(b, a);
    if (op == "%" && a.is_string()) throw RenderFailure("unsupported: '%' string formatting");
    throw RenderFailure("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                        type_name(b) + "'");
  }

  Value repeat(const Value& seq, const Value& times) {
    const int64_t k = std::max<int64_t>(0, as_index(times));
    if (k == 0 || (seq.is_string() ? seq.as_string().empty() : seq.as_list().empty())) {
      if (seq.is_string()) return Value("");
      List empty;
      empty.kind = seq.as_list().kind;
      return Value::list(std::move(empty));
    }
    if (seq.is_string()) {
      const size_t n = seq.as_string().size();
      if (n > 0 && static_cast<uint64_t>(k) > limits_.max_output_bytes / n) check_size(SIZE_MAX);
      std::string out;
      for (int64_t i = 0; i < k; ++i) out += seq.as_string();
      return Value(std::move(out));
    }
    const size_t n = seq.as_list().size();
    if (n > 0 && static_cast<uint64_t>(k) > static_cast<uint64_t>(limits_.max_steps) / n) {
      throw RenderFailure("list repetition larger than RenderLimits::max_steps items");
    }
    List out;
    out.kind = seq.as_list().kind;
    for (int64_t i = 0; i < k; ++i)
      out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
    return Value::list(std::move(out));
  }

  bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    if (op == "<") return less_than(a, b);
    if (op == ">") return less_than(b, a);
    if (op == "<=") return !less_than(b, a);
    return !less_than(a, b);  // >=
  }

  Value eval_inner(const Node& n, const ScopePtr& scope) {
    switch (n.kind) {
      case NodeKind::kLiteral:
        return n.value;
      case NodeKind::kName:
        return lookup(n.name, scope);
      case NodeKind::kList: {
        List items;
        for (const NodePtr& a : n.args) items.push_back(eval(*a, scope));
        if (!n.name.empty()) items.kind = SeqKind::kTuple;  // "tuple"
        return Value::list(std::move(items));
      }
      case NodeKind::kDict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < n.args.size(); i += 2) {
          const Value key = eval(*n.args[i], scope);
          d.as_dict().set_key(key, eval(*n.args[i + 1], scope));
        }
        return d;
      }
      case NodeKind::kAttribute:
        return get_attr(eval(*n.args[0], scope), n.name);
      case NodeKind::kItem:
        return get_item(eval(*n.args[0], scope), eval(*n.args[1], scope));
      case NodeKind::kSlice: {
        const auto part = [&](size_t k) {
          return n.args[k] ? eval(*n.args[k], scope) : Value(None{});
        };
        return slice(eval(*n.args[0], scope), part(1), part(2), part(3));
      }
      case NodeKind::kCall: {
        const Value callee = eval(*n.args[0], scope);
        if (callee.is_undefined()) fail_undefined(callee);
        if (!callee.is_callable())
          throw RenderFailure("'" + type_name(callee) + "' object is not callable");
        CallArgs args = eval_args(n, scope, 1);
        return callee.as_function().call(args);
      }
      case NodeKind::kFilter: {
        const Value subject = eval(*n.args[0], scope);
        CallArgs args = eval_args(n, scope, 1);
        return apply_filter(n.name, subject, args, limits_);
      }
      case NodeKind::kTest: {
        const Value subject = eval(*n.args[0], scope);
        std::vector<Value> args;
        for (size_t i = 1; i < n.args.size(); ++i) args.push_back(eval(*n.args[i], scope));
        if (!n.kwargs.empty()) throw RenderFailure("unsupported: keyword arguments to a test");
        return Value(apply_test(n.name, subject, args) != n.negate);
      }
      case NodeKind::kUnary: {
        const Value v = eval(*n.args[0], scope);
        if (n.name == "not") return Value(!truthy(v));
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number())
          throw RenderFailure("bad operand type for unary " + n.name + ": '" + type_name(v) + "'");
        if (n.name == "+") return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : v;
        if (v.is_float()) return Value(-v.as_float());
        const int64_t x = v.is_int() ? v.as_int() : v.as_bool();
        if (x == std::numeric_limits<int64_t>::min())
          throw RenderFailure("integer overflow (beyond int64)");
        return Value(-x);
      }
      case NodeKind::kBinary: {
        if (n.name == "and" || n.name == "or") {
          Value a = eval(*n.args[0], scope);
          if (truthy(a) == (n.name == "or")) return a;
          return eval(*n.args[1], scope);
        }
        const Value a = eval(*n.args[0], scope);
        const Value b = eval(*n.args[1], scope);
        if (n.name == "~") {
          std::string s = str_of(a, limits_.max_output_bytes);
          const std::string t = str_of(b, limits_.max_output_bytes);
          check_size(s.size() + t.size());
          return Value(s + t);
        }
        return arithmetic(n.name, a, b);
      }
      case NodeKind::kCompare: {
        Value left = eval(*n.args[0], scope);
        for (size_t i = 0; i < n.ops.size(); ++i) {
          Value right = eval(*n.args[i + 1], scope);
          if (!compare(n.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case NodeKind::kCondition:
        if (truthy(eval(*n.args[0], scope))) return eval(*n.args[1], scope);
        if (n.args[2]) return eval(*n.args[2], scope);
        return Value::undefined("the conditional expression had no else branch");
      default:
        fail_at(n.pos, "internal: a statement where an expression belongs");
    }
  }

  const std::string& source_;
  const RenderLimits& limits_;
  size_t output_bytes_ = 0;
  uint64_t work_bytes_ = 0;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int loop_depth_ = 0;
};

// Unknown filters and tests are refused at load, as jinja2 refuses them at compile time --
// except where jinja2 defers that to the render: inside an if (its test and branches) or a
// conditional expression, up to the next loop, macro or block body ("soft" frames there).
void check_names(const std::vector<NodePtr>& nodes, const std::string& source, bool soft);

void check_node(const Node& n, const std::string& source, bool soft) {
  if (!soft && n.kind == NodeKind::kFilter && !is_known_filter(n.name)) {
    throw make_error(source, ":", n.pos.line, ":", n.pos.column, ": unsupported filter '", n.name,
                     "'");
  }
  if (!soft && n.kind == NodeKind::kTest && !is_known_test(n.name)) {
    throw make_error(source, ":", n.pos.line, ":", n.pos.column, ": unsupported test '", n.name,
                     "'");
  }
  const bool soft_here = soft || n.kind == NodeKind::kIf || n.kind == NodeKind::kCondition;
  for (size_t i = 0; i < n.args.size(); ++i) {
    // A loop's filter condition runs in the loop's own frame; its iterable does not.
    const bool arg_soft = n.kind == NodeKind::kFor && i == 1 ? false : soft_here;
    if (n.args[i]) check_node(*n.args[i], source, arg_soft);
  }
  for (const auto& kw : n.kwargs) check_node(*kw.second, source, soft_here);
  const bool inner = n.kind == NodeKind::kFor || n.kind == NodeKind::kMacro ||
                     n.kind == NodeKind::kCallBlock || n.kind == NodeKind::kSetBlock ||
                     n.kind == NodeKind::kFilterBlock;
  check_names(n.body, source, inner ? false : soft_here);
  check_names(n.else_body, source, inner ? false : soft_here);
}

void check_names(const std::vector<NodePtr>& nodes, const std::string& source, bool soft) {
  for (const NodePtr& n : nodes) check_node(*n, source, soft);
}

}  // namespace

Template::Template(std::string_view text, std::string source_name)
    : source_name_(std::move(source_name)), text_(text) {
  const std::vector<Token> tokens = tokenize(text, source_name_);
  auto body = std::make_shared<std::vector<NodePtr>>(parse_template(tokens, source_name_));
  check_names(*body, source_name_, /*soft=*/false);
  body_ = std::move(body);
}

std::string Template::render(const Dict& context, const RenderOptions& options) const {
  // Namespaces are the only mutable objects (lists and dicts are immutable, as in
  // transformers' sandbox), so only they can form cycles (`ns.self = ns`): all are emptied
  // when the render ends, however it ends.
  std::vector<std::shared_ptr<Dict>> namespaces;
  struct Clear {
    std::vector<std::shared_ptr<Dict>>& all;
    ~Clear() {
      for (const auto& d : all) d->clear();
    }
  } clear{namespaces};
  auto globals = std::make_shared<Scope>();
  const Value builtins = make_globals(options, &namespaces);
  for (const auto& [name, value] : builtins.as_dict().items()) globals->vars[name] = value;
  for (const auto& [name, value] : context.items()) globals->vars[name] = value;
  auto top = std::make_shared<Scope>();
  top->parent = globals;
  std::string out;
  Interpreter(source_name_, options).exec_top(*body_, top, out);
  return out;
}

}  // namespace metrale::chat
