#pragma once
// Small typed accessors over nlohmann::json that turn a wrong or missing field into an Error
// naming the field's path ("pre_tokenizer.pretokenizers[2].behavior: expected a string").
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "core/error.h"

namespace metrale::tok {

using Json = nlohmann::json;

inline std::string describe(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "a number";
  }
}

inline const Json& field(const Json& j, std::string_view key, const std::string& where) {
  METRALE_CHECK(j.is_object(), where, ": expected an object, found ", describe(j));
  auto it = j.find(key);
  METRALE_CHECK(it != j.end(), where, ": missing field '", key, "'");
  return *it;
}

inline std::string get_string(const Json& j, std::string_view key, const std::string& where) {
  const Json& v = field(j, key, where);
  METRALE_CHECK(v.is_string(), where, ".", key, ": expected a string, found ", describe(v));
  return v.get<std::string>();
}

inline bool get_bool(const Json& j, std::string_view key, bool fallback, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  METRALE_CHECK(it->is_boolean(), where, ".", key, ": expected a boolean, found ", describe(*it));
  return it->get<bool>();
}

inline const Json& get_array(const Json& j, std::string_view key, const std::string& where) {
  const Json& v = field(j, key, where);
  METRALE_CHECK(v.is_array(), where, ".", key, ": expected an array, found ", describe(v));
  return v;
}

inline std::string type_of(const Json& j, const std::string& where) { return get_string(j, "type", where); }

}  // namespace metrale::tok
