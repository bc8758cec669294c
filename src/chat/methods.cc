// The str / dict methods templates call and transformers' globals (range, namespace, dict,
// raise_exception, strftime_now), as Python defines them.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>

#include "chat/builtin_args.h"
#include "chat/pystr.h"
#include "chat/template.h"

namespace metrale::chat {

using namespace builtin;  // NOLINT(google-build-using-namespace): the helpers of builtin_args.h

namespace {

Value method(std::string name, std::function<Value(CallArgs&)> fn) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = std::move(fn);
  return Value(std::shared_ptr<const Function>(std::move(f)));
}

std::optional<Value> string_method(const std::string& s, const std::string& name,
                                   const RenderLimits& limits) {
  const std::string what = "str." + name;
  if (name == "startswith" || name == "endswith") {
    return method(what, [s, name, what](CallArgs& a) {
      check_arity(a, what, 1, {});
      const Value* p = arg(a, 0, "");
      std::vector<std::string> options;
      if (p && p->is_list()) {
        for (const Value& x : p->as_list()) options.push_back(need_string(&x, what));
      } else {
        options.push_back(need_string(p, what));
      }
      for (const std::string& o : options) {
        if (name == "startswith"
                ? s.compare(0, o.size(), o) == 0
                : (s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0)) {
          return Value(true);
        }
      }
      return Value(false);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return method(what, [s, name, what](CallArgs& a) {
      check_arity(a, what, 1, {});
      return Value(
          py_strip(s, opt_string(arg(a, 0, ""), what), name != "rstrip", name != "lstrip"));
    });
  }
  if (name == "split" || name == "rsplit") {
    return method(what, [s, name, what](CallArgs& a) {
      check_arity(a, what, 2, {"sep", "maxsplit"});
      const std::optional<std::string> sep = opt_string(arg(a, 0, "sep"), what);
      if (sep && sep->empty()) fail("empty separator");
      return string_list(
          py_split(s, sep, int_arg(arg(a, 1, "maxsplit"), -1, what), name == "rsplit"));
    });
  }
  if (name == "replace") {
    return method(what, [s, what, &limits](CallArgs& a) {
      check_arity(a, what, 3, {});
      std::optional<std::string> out =
          py_replace(s, need_string(arg(a, 0, ""), what), need_string(arg(a, 1, ""), what),
                     int_arg(arg(a, 2, ""), -1, what), limits.max_output_bytes);
      if (!out) check_size(SIZE_MAX, limits);
      return Value(std::move(*out));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return method(what, [s, name, what](CallArgs& a) {
      check_arity(a, what, 0, {});
      if (name == "upper") return Value(py_upper(s));
      if (name == "lower") return Value(py_lower(s));
      if (name == "title") return Value(py_title(s));
      return Value(py_capitalize(s));
    });
  }
  if (name == "join") {
    return method(what, [s, what, &limits](CallArgs& a) {
      check_arity(a, what, 1, {});
      std::string out;
      bool first = true;
      for (const Value& x : iterate(a.positional.empty() ? Value() : a.positional[0])) {
        if (!first) out += s;
        first = false;
        out += need_string(&x, what);
        check_size(out.size(), limits);
      }
      return Value(std::move(out));
    });
  }
  if (name == "format") {
    return method(what, [s, &limits](CallArgs& a) {
      // Python's str.format for plain fields only: {}, {0}, {name}; {{ and }} escape braces.
      std::string out;
      size_t auto_index = 0;
      bool manual = false;
      for (size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        if ((c == '{' || c == '}') && i + 1 < s.size() && s[i + 1] == c) {
          out += c;
          ++i;
          continue;
        }
        if (c == '}') fail("Single '}' encountered in format string");
        if (c != '{') {
          out += c;
          continue;
        }
        const size_t close = s.find('}', i);
        if (close == std::string::npos) fail("Single '{' encountered in format string");
        const std::string field = s.substr(i + 1, close - i - 1);
        if (field.find_first_of(":!.[{") != std::string::npos) {
          fail("unsupported: str.format field '{" + field + "}' (only {}, {0}, {name})");
        }
        const Value* v = nullptr;
        const bool numbered = !field.empty() && std::all_of(field.begin(), field.end(), ::isdigit);
        if ((field.empty() && manual) || (numbered && auto_index > 0)) {
          fail(manual
                   ? "cannot switch from manual field specification to automatic field numbering"
                   : "cannot switch from automatic field numbering to manual field specification");
        }
        manual = manual || numbered;
        if (field.empty()) {
          v = arg(a, auto_index++, "");
        } else if (numbered) {
          const size_t k = std::strtoull(field.c_str(), nullptr, 10);
          v = k < a.positional.size() ? &a.positional[k] : nullptr;
        } else {
          for (const auto& [key, value] : a.keyword) {
            if (key == field) v = &value;
          }
        }
        if (v == nullptr) fail("str.format: no argument for field '{" + field + "}'");
        out += str_of(*v, limits.max_output_bytes);
        check_size(out.size(), limits);
        i = close;
      }
      return Value(std::move(out));
    });
  }
  if (name == "find" || name == "count") {
    return method(what, [s, name, what](CallArgs& a) {
      check_arity(a, what, 1, {});
      const std::string& sub = need_string(arg(a, 0, ""), what);
      if (name == "find") {
        const size_t at = s.find(sub);
        return Value(at == std::string::npos
                         ? int64_t{-1}
                         : static_cast<int64_t>(codepoint_count(s.substr(0, at))));
      }
      if (sub.empty()) return Value(static_cast<int64_t>(codepoint_count(s) + 1));
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value(n);
    });
  }
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& obj, const std::string& name) {
  const std::string what = "dict." + name;
  if (name == "items") {
    return method(what, [obj, what](CallArgs& a) {
      check_arity(a, what, 0, {});
      return items_of(obj, SeqKind::kDictItems);
    });
  }
  if (name == "keys" || name == "values") {
    return method(what, [obj, name, what](CallArgs& a) {
      check_arity(a, what, 0, {});
      List out;
      const Dict& d = obj.as_dict();
      for (size_t i = 0; i < d.size(); ++i)
        out.push_back(name == "keys" ? d.key(i) : d.items()[i].second);
      return Value::seq(std::move(out), name == "keys" ? SeqKind::kDictKeys : SeqKind::kDictValues);
    });
  }
  if (name == "get") {
    return method(what, [obj, what](CallArgs& a) {
      check_arity(a, what, 2, {});
      const Value* key = arg(a, 0, "");
      if (key == nullptr) fail("dict.get needs a key");
      const Value* found = obj.as_dict().find(*key);
      if (found) return *found;
      return a.positional.size() > 1 ? a.positional[1] : Value(None{});
    });
  }
  return std::nullopt;
}

constexpr std::string_view kUnsafe[] = {"append",  "extend", "insert", "pop",
                                        "remove",  "clear",  "update", "setdefault",
                                        "popitem", "sort",   "reverse"};

}  // namespace

std::optional<Value> bound_method(const Value& obj, const std::string& name,
                                  const RenderLimits& limits) {
  if (obj.is_string()) return string_method(obj.as_string(), name, limits);
  if (obj.is_dict() && !obj.as_dict().is_namespace) {
    if (auto m = dict_method(obj, name)) return m;
  }
  if ((obj.is_list() || obj.is_dict()) &&
      std::find(std::begin(kUnsafe), std::end(kUnsafe), name) != std::end(kUnsafe)) {
    // transformers renders in jinja2's ImmutableSandboxedEnvironment: lists and dicts are
    // read-only (a namespace is the way to accumulate).
    const std::string msg =
        "access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe";
    return method(name, [msg](CallArgs&) -> Value { fail(msg); });
  }
  return std::nullopt;
}

Value make_globals(const RenderOptions& options, std::vector<std::shared_ptr<Dict>>* namespaces) {
  Value g = Value::dict();
  Dict& d = g.as_dict();
  const RenderLimits limits = options.limits;
  d.set("range", method("range", [limits](CallArgs& a) {
          check_arity(a, "range", 3, {});
          if (a.positional.empty()) fail("range expected at least 1 argument, got 0");
          int64_t start = 0;
          int64_t stop = 0;
          int64_t step = 1;
          if (a.positional.size() == 1) {
            stop = int_arg(&a.positional[0], 0, "range");
          } else {
            start = int_arg(&a.positional[0], 0, "range");
            stop = int_arg(&a.positional[1], 0, "range");
            if (a.positional.size() == 3) step = int_arg(&a.positional[2], 1, "range");
          }
          if (step == 0) fail("range() arg 3 must not be zero");
          const long double count = std::max<long double>(
              0,
              std::ceil((static_cast<long double>(stop) - start) / static_cast<long double>(step)));
          if (count > static_cast<long double>(limits.max_steps)) {
            fail("range of more than RenderLimits::max_steps items");
          }
          List out;
          for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
            out.emplace_back(start);
            if (__builtin_add_overflow(start, step, &start)) break;
          }
          return Value::seq(std::move(out), SeqKind::kRange);
        }));
  const auto build_dict = [](CallArgs& a, const std::string& what) {
    Value out = Value::dict();
    if (a.positional.size() > 1) fail(what + " takes at most one positional argument");
    if (!a.positional.empty()) {
      const Value& init = a.positional[0];
      if (!init.is_dict() || init.as_dict().is_namespace)
        fail(what + " needs a mapping as its argument");
      const Dict& src = init.as_dict();
      for (size_t i = 0; i < src.size(); ++i)
        out.as_dict().set_key(src.key(i), src.items()[i].second);
    }
    for (const auto& [k, v] : a.keyword) out.as_dict().set(k, v);
    return out;
  };
  d.set("dict", method("dict", [build_dict](CallArgs& a) { return build_dict(a, "dict()"); }));
  d.set("namespace", method("namespace", [build_dict, namespaces](CallArgs& a) {
          Value ns = build_dict(a, "namespace()");
          ns.as_dict().is_namespace = true;
          namespaces->push_back(std::get<std::shared_ptr<Dict>>(ns.storage()));
          return ns;
        }));
  d.set("raise_exception", method("raise_exception", [](CallArgs& a) -> Value {
          fail("raise_exception: " +
               (a.positional.empty() ? std::string() : str_of(a.positional[0])));
        }));
  const std::function<std::tm()> now = options.now;
  d.set("strftime_now", method("strftime_now", [now](CallArgs& a) {
          check_arity(a, "strftime_now", 1, {});
          const std::string& fmt = need_string(arg(a, 0, ""), "strftime_now");
          std::tm t{};
          if (now) {
            t = now();
          } else {
            const std::time_t s = std::time(nullptr);
            localtime_r(&s, &t);
          }
          if (fmt.empty()) return Value("");
          std::string buf(fmt.size() * 8 + 64, '\0');
          const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &t);
          if (n == 0) fail("strftime_now: format too long or empty result");
          buf.resize(n);
          return Value(std::move(buf));
        }));
  return g;
}

}  // namespace metrale::chat
