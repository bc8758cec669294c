// jinja2's filters and tests, as jinja2 defines them for the types a chat template meets.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <initializer_list>

#include "chat/builtin_args.h"
#include "chat/pystr.h"
#include "chat/template.h"

namespace metrale::chat {

using namespace builtin;  // NOLINT(google-build-using-namespace): builtin_args.h's helpers

namespace builtin {

Value items_of(const Value& v, SeqKind kind) {
  if (v.is_undefined()) return Value::seq(List(), kind);
  if (!v.is_dict() || v.as_dict().is_namespace) fail("can only get item pairs from a mapping");
  List out;
  const Dict& d = v.as_dict();
  for (size_t i = 0; i < d.size(); ++i)
    out.push_back(Value::tuple({d.key(i), d.items()[i].second}));
  return Value::seq(std::move(out), kind);
}
}  // namespace builtin

namespace {

// jinja2's environment.getattr for filters' `attribute=` (dotted paths, integer parts index).
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  for (const std::string& part : py_split(path, std::string("."), -1, false)) {
    if (cur.is_dict()) {
      const Value* x = cur.as_dict().find(part);
      cur = x ? *x : Value::undefined("'dict object' has no attribute '" + part + "'");
    } else if (cur.is_list() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      const size_t i = std::strtoull(part.c_str(), nullptr, 10);
      cur = i < cur.as_list().size() ? cur.as_list()[i] : Value::undefined("index out of range");
    } else if (cur.is_undefined()) {
      fail(cur.undefined_hint());
    } else {
      cur = Value::undefined("'" + type_name(cur) + " object' has no attribute '" + part + "'");
    }
  }
  return cur;
}

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) {
    if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) >= 9.2e18) return fallback;
    return Value(static_cast<int64_t>(v.as_float()));
  }
  if (v.is_string()) {
    const std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0)
      return Value(static_cast<int64_t>(i));
    const double d = std::strtod(s.c_str(), &end);  // jinja2 falls back to int(float(s))
    if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value(static_cast<int64_t>(d));
    }
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(to_double(v));
  if (v.is_string()) {
    const std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value(d);
  }
  return fallback;
}

Value select(const Value& subject, CallArgs& a, bool by_attribute, bool keep) {
  const std::string what =
      by_attribute ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject");
  size_t i = 0;
  std::string attr;
  if (by_attribute) attr = need_string(arg(a, i++, ""), what + " attribute");
  std::string test;
  std::vector<Value> test_args;
  if (i < a.positional.size()) {
    test = need_string(&a.positional[i++], what + " test");
    test_args.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(i), a.positional.end());
    if (!is_known_test(test)) fail("unsupported test '" + test + "'");
  }
  if (!a.keyword.empty()) fail(what + " takes no keyword arguments");
  List out;
  if (!truthy(subject)) return Value::seq(List(), SeqKind::kGenerator);  // jinja2: `if value:`
  for (const Value& item : iterate(subject)) {
    const Value v = by_attribute ? attribute_path(item, attr) : item;
    const bool pass = test.empty() ? truthy(v) : apply_test(test, v, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::seq(std::move(out), SeqKind::kGenerator);
}

Value tojson(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  check_arity(a, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.max_bytes = limits.max_output_bytes;
  if (const Value* x = arg(a, 0, "ensure_ascii")) o.ensure_ascii = truthy(*x);
  if (const Value* x = arg(a, 1, "indent"); x && !x->is_none()) {
    if (x->is_string()) fail("unsupported: a string indent for tojson");
    o.indent = int_arg(x, 0, "tojson indent");
  }
  if (const Value* x = arg(a, 2, "separators"); x && !x->is_none()) {
    if (!x->is_list() || x->as_list().size() != 2)
      fail("tojson separators must be a pair of strings");
    o.item_separator = need_string(&x->as_list()[0], "tojson separators");
    o.key_separator = need_string(&x->as_list()[1], "tojson separators");
    if (o.item_separator.empty()) fail("unsupported: an empty tojson item separator");
  }
  if (const Value* x = arg(a, 3, "sort_keys")) o.sort_keys = truthy(*x);
  return Value(json_dumps(v, o));
}

Value join(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  check_arity(a, "join", 2, {"d", "attribute"});
  const Value* sep = arg(a, 0, "d");
  const std::string d = sep ? str_of(*sep) : "";
  const Value* attr = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += d;
    first = false;
    out += str_of(attr && !attr->is_none() ? attribute_path(item, str_of(*attr)) : item);
    check_size(out.size(), limits);
  }
  return Value(std::move(out));
}

Value map_filter(const Value& v, CallArgs& a, const RenderLimits& limits) {
  List out;
  const auto generator = [](List items) {
    return Value::seq(std::move(items), SeqKind::kGenerator);
  };
  if (!truthy(v)) return generator(List());  // jinja2: `if value: for item in value`
  if (const Value* attr = arg(a, 99, "attribute")) {
    check_arity(a, "map", 0, {"attribute", "default"});
    const Value* dflt = arg(a, 99, "default");
    for (const Value& item : iterate(v)) {
      Value x = attribute_path(item, str_of(*attr));
      if (x.is_undefined() && dflt) x = *dflt;
      out.push_back(std::move(x));
    }
    return generator(std::move(out));
  }
  if (a.positional.empty()) fail("map needs a filter name or attribute=");
  const std::string name = need_string(&a.positional[0], "map filter");
  if (!is_known_filter(name) || name == "map") fail("unsupported filter '" + name + "' in map");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : iterate(v)) {
    CallArgs copy = rest;
    out.push_back(apply_filter(name, item, copy, limits));
  }
  return generator(std::move(out));
}

Value round_filter(const Value& v, const CallArgs& a) {
  check_arity(a, "round", 2, {"precision", "method"});
  if (!v.is_number()) fail("round needs a number, got " + type_name(v));
  const int64_t precision = int_arg(arg(a, 0, "precision"), 0, "round precision");
  const std::string method = arg(a, 1, "method") ? str_of(*arg(a, 1, "method")) : "common";
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = to_double(v) * scale;
  double r = 0;
  if (method == "common") {
    r = std::nearbyint(x);  // Python's round(): halves to even
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    fail("round method must be 'common', 'ceil' or 'floor'");
  }
  return Value(r / scale);
}

Value indent(const Value& v, const CallArgs& a, const RenderLimits& limits) {
  check_arity(a, "indent", 3, {"width", "first", "blank"});
  const Value* w = arg(a, 0, "width");
  const std::string pad =
      w && w->is_string()
          ? w->as_string()
          : std::string(
                static_cast<size_t>(std::clamp<int64_t>(int_arg(w, 4, "indent width"), 0, 1024)),
                ' ');
  const bool first = arg(a, 1, "first") && truthy(*arg(a, 1, "first"));
  const bool blank = arg(a, 2, "blank") && truthy(*arg(a, 2, "blank"));
  std::string s = str_of(v);
  // jinja2 splits on Python's line boundaries; chat templates only meet "\n".
  std::vector<std::string> lines = py_split(s, std::string("\n"), -1, false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += '\n';
    const bool is_blank = py_strip(lines[i], std::nullopt, true, true).empty();
    if ((i > 0 || first) && (blank || !is_blank)) out += pad;
    out += lines[i];
    check_size(out.size(), limits);
  }
  return Value(std::move(out));
}

// jinja2's sort key: the attribute path(s) (comma-separated), strings lowercased unless
// case_sensitive.
Value sort_key(const Value& item, const Value* attribute, bool case_sensitive) {
  const auto fold = [&](Value v) {
    return !case_sensitive && v.is_string() ? Value(py_lower(v.as_string())) : v;
  };
  if (attribute == nullptr || attribute->is_none()) return fold(item);
  const std::vector<std::string> parts = py_split(str_of(*attribute), std::string(","), -1, false);
  if (parts.size() == 1) return fold(attribute_path(item, parts[0]));
  List keys;
  for (const std::string& p : parts) keys.push_back(fold(attribute_path(item, p)));
  return Value::list(std::move(keys));
}

List sorted_by(List items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return reverse ? less_than(keys[y], keys[x]) : less_than(keys[x], keys[y]);
  });
  List out;
  for (size_t i : order) out.push_back(items[i]);
  return out;
}

Value sort_filters(std::string_view name, const Value& v, const CallArgs& a) {
  const std::string what = "filter '" + std::string(name) + "'";
  if (name == "sort") {
    check_arity(a, what, 3, {"reverse", "case_sensitive", "attribute"});
    const bool reverse = arg(a, 0, "reverse") && truthy(*arg(a, 0, "reverse"));
    const bool cs = arg(a, 1, "case_sensitive") && truthy(*arg(a, 1, "case_sensitive"));
    List items = iterate(v);
    std::vector<Value> keys;
    for (const Value& x : items) keys.push_back(sort_key(x, arg(a, 2, "attribute"), cs));
    return Value::list(sorted_by(std::move(items), keys, reverse));
  }
  if (name == "dictsort") {
    check_arity(a, what, 3, {"case_sensitive", "by", "reverse"});
    const bool cs = arg(a, 0, "case_sensitive") && truthy(*arg(a, 0, "case_sensitive"));
    const std::string by = arg(a, 1, "by") ? str_of(*arg(a, 1, "by")) : "key";
    if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
    const bool reverse = arg(a, 2, "reverse") && truthy(*arg(a, 2, "reverse"));
    if (!v.is_dict() || v.as_dict().is_namespace)
      fail("dictsort needs a mapping, got " + type_name(v));
    List items;
    std::vector<Value> keys;
    const Dict& d = v.as_dict();
    for (size_t i = 0; i < d.size(); ++i) {
      items.push_back(Value::tuple({d.key(i), d.items()[i].second}));
      keys.push_back(sort_key(by == "key" ? d.key(i) : d.items()[i].second, nullptr, cs));
    }
    return Value::list(sorted_by(std::move(items), keys, reverse));
  }
  if (name == "min" || name == "max") {
    check_arity(a, what, 2, {"case_sensitive", "attribute"});
    const bool cs = arg(a, 0, "case_sensitive") && truthy(*arg(a, 0, "case_sensitive"));
    const List items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    Value best_key = sort_key(items[0], arg(a, 1, "attribute"), cs);
    for (size_t i = 1; i < items.size(); ++i) {
      const Value k = sort_key(items[i], arg(a, 1, "attribute"), cs);
      if (name == "min" ? less_than(k, best_key) : less_than(best_key, k)) {
        best = i;
        best_key = k;
      }
    }
    return items[best];
  }
  // sum
  check_arity(a, what, 2, {"attribute", "start"});
  Value total = arg(a, 1, "start") ? *arg(a, 1, "start") : Value(0);
  for (const Value& x : iterate(v)) {
    const Value item = arg(a, 0, "attribute") && !arg(a, 0, "attribute")->is_none()
                           ? attribute_path(x, str_of(*arg(a, 0, "attribute")))
                           : x;
    if (!item.is_number() || !total.is_number()) {
      fail("unsupported operand type(s) for +: '" + type_name(total) + "' and '" + type_name(item) +
           "'");
    }
    if (total.is_float() || item.is_float()) {
      total = Value(to_double(total) + to_double(item));
    } else {
      int64_t r = 0;
      const int64_t x1 = total.is_int() ? total.as_int() : total.as_bool();
      const int64_t x2 = item.is_int() ? item.as_int() : item.as_bool();
      if (__builtin_add_overflow(x1, x2, &r)) fail("integer overflow (beyond int64) in sum");
      total = Value(r);
    }
  }
  return total;
}

Value length_of(const Value& v) {
  if (v.is_undefined()) return Value(0);
  if (v.is_string()) return Value(static_cast<int64_t>(codepoint_count(v.as_string())));
  if (v.is_list() && v.as_list().kind != SeqKind::kGenerator) {
    return Value(static_cast<int64_t>(v.as_list().size()));
  }
  if (v.is_dict() && !v.as_dict().is_namespace)
    return Value(static_cast<int64_t>(v.as_dict().size()));
  fail("object of type '" + type_name(v) + "' has no len()");
}

constexpr std::string_view kFilters[] = {
    "abs",    "capitalize", "count",      "d",           "default", "dictsort", "e",
    "escape", "first",      "float",      "forceescape", "indent",  "int",      "items",
    "join",   "last",       "length",     "list",        "lower",   "map",      "max",
    "min",    "reject",     "rejectattr", "replace",     "reverse", "round",    "safe",
    "select", "selectattr", "sort",       "string",      "sum",     "title",    "tojson",
    "trim",   "unique",     "upper",      "wordcount",
};
constexpr std::string_view kTests[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",      "equalto", "even",      "false",
    "filter",  "float",    "ge",       "greaterthan", "gt",      "in",      "integer",   "iterable",
    "le",      "lessthan", "lower",    "lt",          "mapping", "ne",      "none",      "number",
    "odd",     "sameas",   "sequence", "string",      "test",    "true",    "undefined", "upper",
};

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool is_known_filter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}
bool is_known_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

List iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.as_list();
  if (v.is_dict() && !v.as_dict().is_namespace) {
    List keys;
    for (size_t i = 0; i < v.as_dict().size(); ++i) keys.push_back(v.as_dict().key(i));
    return keys;
  }
  if (v.is_string()) {
    // One Value per character: bounded, so a long text cannot cost gigabytes (indexing and
    // slicing strings do not come here).
    constexpr size_t kMaxChars = size_t{1} << 20;
    if (v.as_string().size() > kMaxChars && codepoint_count(v.as_string()) > kMaxChars) {
      fail("unsupported: iterating over a string of more than " + std::to_string(kMaxChars) +
           " characters");
    }
    List chars;
    for (std::string_view c : split_codepoints(v.as_string())) chars.emplace_back(std::string(c));
    return chars;
  }
  fail("'" + type_name(v) + "' object is not iterable");
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      fail("'in <string>' requires string as left operand, not " + type_name(item));
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict() && !container.as_dict().is_namespace) {
    return container.as_dict().find(item) != nullptr;
  }
  if (container.is_list() || container.is_undefined()) {
    for (const Value& x : iterate(container)) {
      if (equals(x, item)) return true;
    }
    return false;
  }
  fail("argument of type '" + type_name(container) + "' is not iterable");
}

Value apply_filter(std::string_view name, const Value& v, CallArgs& a, const RenderLimits& limits) {
  const std::string what = "filter '" + std::string(name) + "'";
  if (name == "default" || name == "d") {
    check_arity(a, what, 2, {"default_value", "boolean"});
    const Value* dflt = arg(a, 0, "default_value");
    const bool boolean = arg(a, 1, "boolean") && truthy(*arg(a, 1, "boolean"));
    if (v.is_undefined() || (boolean && !truthy(v))) return dflt ? *dflt : Value("");
    return v;
  }
  if (name == "safe" || name == "string") {
    check_arity(a, what, 0, {});
    if (name == "string" && v.is_string()) return v;  // a Markup stays one
    return name == "safe" ? Value::markup(str_of(v, limits.max_output_bytes))
                          : Value(str_of(v, limits.max_output_bytes));
  }
  if (name == "escape" || name == "e" || name == "forceescape") {
    check_arity(a, what, 0, {});
    if (v.is_markup() && name != "forceescape") return v;
    return Value::markup(html_escape(str_of(v, limits.max_output_bytes)));
  }
  if (name == "length" || name == "count") return length_of(v);
  if (name == "tojson") return tojson(v, a, limits);
  if (name == "items") return items_of(v, SeqKind::kGenerator);
  if (name == "join") return join(v, a, limits);
  if (name == "map") return map_filter(v, a, limits);
  if (name == "selectattr" || name == "rejectattr") return select(v, a, true, name == "selectattr");
  if (name == "select" || name == "reject") return select(v, a, false, name == "select");
  if (name == "round") return round_filter(v, a);
  if (name == "indent") return indent(v, a, limits);
  if (name == "list") {
    List items = iterate(v);
    items.kind = SeqKind::kList;
    return Value::list(std::move(items));
  }
  if (name == "first" || name == "last") {
    if (name == "last" && v.is_list() && v.as_list().kind == SeqKind::kGenerator) {
      fail("'generator' object is not reversible");
    }
    const List items = iterate(v);
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    if (v.is_string()) {
      std::string s;
      for (const Value& c : items) s += c.as_string();
      return Value(std::move(s));
    }
    // reversed(): an iterator; a generator cannot be reversed, so jinja2 makes a list of it.
    const bool was_generator = v.is_list() && v.as_list().kind == SeqKind::kGenerator;
    return Value::seq(std::move(items), was_generator ? SeqKind::kList : SeqKind::kGenerator);
  }
  if (name == "unique") {
    check_arity(a, what, 2, {"case_sensitive", "attribute"});
    const bool case_sensitive = arg(a, 0, "case_sensitive") && truthy(*arg(a, 0, "case_sensitive"));
    const Value* attr = arg(a, 1, "attribute");
    const auto key = [&](const Value& x) {
      const Value k = attr && !attr->is_none() ? attribute_path(x, str_of(*attr)) : x;
      return !case_sensitive && k.is_string() ? Value(py_lower(k.as_string())) : k;
    };
    List out;
    List keys;
    for (const Value& x : iterate(v)) {
      const Value k = key(x);
      if (std::none_of(keys.begin(), keys.end(), [&](const Value& y) { return equals(k, y); })) {
        keys.push_back(k);
        out.push_back(x);
      }
    }
    return Value::seq(std::move(out), SeqKind::kGenerator);
  }
  if (name == "sort" || name == "dictsort" || name == "min" || name == "max" || name == "sum") {
    return sort_filters(name, v, a);
  }
  if (name == "int") {
    check_arity(a, what, 2, {"default", "base"});
    if (arg(a, 1, "base") && int_arg(arg(a, 1, "base"), 10, "int base") != 10)
      fail("unsupported: int base");
    return to_int(v, arg(a, 0, "default") ? *arg(a, 0, "default") : Value(0));
  }
  if (name == "float") {
    check_arity(a, what, 1, {"default"});
    return to_float(v, arg(a, 0, "default") ? *arg(a, 0, "default") : Value(0.0));
  }
  if (name == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_int() && v.as_int() != INT64_MIN)
      return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
    fail("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "wordcount") {
    return Value(static_cast<int64_t>(py_split(str_of(v), std::nullopt, -1, false).size()));
  }
  // String filters: jinja2 converts the subject with str() first (undefined -> "").
  const std::string s = str_of(v, limits.max_output_bytes);
  if (name == "trim") {
    check_arity(a, what, 1, {"chars"});
    return Value(py_strip(s, opt_string(arg(a, 0, "chars"), "trim chars"), true, true));
  }
  if (name == "upper") return Value(py_upper(s));
  if (name == "lower") return Value(py_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "replace") {
    check_arity(a, what, 3, {"old", "new", "count"});
    std::optional<std::string> out = py_replace(
        s, need_string(arg(a, 0, "old"), "replace"), need_string(arg(a, 1, "new"), "replace"),
        int_arg(arg(a, 2, "count"), -1, "replace count"), limits.max_output_bytes);
    if (!out) check_size(SIZE_MAX, limits);
    return Value(std::move(*out));
  }
  fail("unsupported filter '" + std::string(name) + "'");
}

bool apply_test(std::string_view name, const Value& v, const std::vector<Value>& args) {
  const auto one = [&]() -> const Value& {
    if (args.size() != 1) fail("test '" + std::string(name) + "' takes one argument");
    return args[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.as_dict().is_namespace;
  if (name == "iterable")
    return v.is_undefined() || v.is_string() || v.is_list() ||
           (v.is_dict() && !v.as_dict().is_namespace);
  if (name == "sequence" && v.is_list()) return v.as_list().indexable();
  if (name == "sequence")
    return v.is_undefined() || v.is_string() || v.is_list() ||
           (v.is_dict() && !v.as_dict().is_namespace);
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_callable();
  if (name == "eq" || name == "equalto" || name == "sameas") return equals(v, one());
  if (name == "ne") return !equals(v, one());
  if (name == "lt" || name == "lessthan") return less_than(v, one());
  if (name == "gt" || name == "greaterthan") return less_than(one(), v);
  if (name == "le") return !less_than(one(), v);
  if (name == "ge") return !less_than(v, one());
  if (name == "in") return contains(one(), v);
  if (name == "lower") return v.is_string() && py_lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && py_upper(v.as_string()) == v.as_string();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool()) fail("test '" + std::string(name) + "' needs an integer");
    const int64_t x = v.is_int() ? v.as_int() : v.as_bool();
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    const int64_t d = int_arg(&one(), 1, "divisibleby");
    if (d == 0) fail("integer division or modulo by zero");
    return d == -1 || x % d == 0;
  }
  if (name == "filter") return v.is_string() && is_known_filter(v.as_string());
  if (name == "test") return v.is_string() && is_known_test(v.as_string());
  fail("unsupported test '" + std::string(name) + "'");
}

}  // namespace metrale::chat
