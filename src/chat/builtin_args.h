#pragma once
// Argument handling shared by the builtins (filters.cc, methods.cc): failures are RenderFailure,
// which the interpreter turns into an Error at the template position.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/template.h"
#include "chat/value.h"

namespace metrale::chat::builtin {

[[noreturn]] inline void fail(std::string what) { throw RenderFailure(std::move(what)); }

// Positional-or-keyword argument `i` / `key` of a call, or nullptr.
inline const Value* arg(const CallArgs& a, size_t i, std::string_view key) {
  if (i < a.positional.size()) return &a.positional[i];
  for (const auto& [k, v] : a.keyword) {
    if (k == key) return &v;
  }
  return nullptr;
}

inline void check_arity(const CallArgs& a, std::string_view what, size_t max_positional,
                        std::initializer_list<std::string_view> keywords) {
  if (a.positional.size() > max_positional) {
    fail(std::string(what) + " takes at most " + std::to_string(max_positional) +
         " positional argument(s), got " + std::to_string(a.positional.size()));
  }
  for (const auto& [k, v] : a.keyword) {
    if (std::find(keywords.begin(), keywords.end(), k) == keywords.end()) {
      fail(std::string(what) + " got an unexpected keyword argument '" + k + "'");
    }
  }
}

inline const std::string& need_string(const Value* v, std::string_view what) {
  if (v == nullptr || !v->is_string()) {
    fail(std::string(what) + " needs a string, got " + (v ? type_name(*v) : "nothing"));
  }
  return v->as_string();
}

inline std::optional<std::string> opt_string(const Value* v, std::string_view what) {
  if (v == nullptr || v->is_none()) return std::nullopt;
  return need_string(v, what);
}

inline int64_t int_arg(const Value* v, int64_t fallback, std::string_view what) {
  if (v == nullptr || v->is_none()) return fallback;
  if (v->is_int()) return v->as_int();
  if (v->is_bool()) return v->as_bool();
  fail(std::string(what) + " needs an integer, got " + type_name(*v));
}

inline void check_size(size_t n, const RenderLimits& limits) {
  if (n > limits.max_output_bytes) {
    fail("value larger than " + std::to_string(limits.max_output_bytes) +
         " bytes (RenderLimits::max_output_bytes)");
  }
}

inline Value string_list(const std::vector<std::string>& parts) {
  List l;
  for (const std::string& p : parts) l.emplace_back(p);
  return Value::list(std::move(l));
}

// The (key, value) tuples of a dict, as a generator (the items filter) or a dict_items view.
Value items_of(const Value& v, SeqKind kind);

}  // namespace metrale::chat::builtin
