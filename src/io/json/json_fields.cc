#include "io/json/json_fields.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace metrale {

using nlohmann::json;

namespace {

// The integer a JSON value holds when it is one that fits in int64.
std::optional<int64_t> as_int64(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return std::nullopt;
  }
  return v.get<int64_t>();
}

bool plain_key(std::string_view key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string field_where(const std::string& source, const std::string& path) {
  return path.empty() ? source : source + ": field '" + path + "'";
}

}  // namespace

std::string describe_json_value(const json& value) {
  constexpr size_t kMaxChars = 60;
  std::string text;
  if (value.is_string()) {
    text = "string \"" + value.get<std::string>() + "\"";
  } else if (value.is_boolean()) {
    text = value.get<bool>() ? "true" : "false";
  } else if (value.is_number_integer()) {
    text = value.dump();
  } else if (value.is_number()) {
    text = "number " + value.dump();
  } else if (value.is_array()) {
    text = "array " + value.dump();
  } else if (value.is_object()) {
    text = "object " + value.dump();
  } else {
    text = value.dump();
  }
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return text;
}

// ---- JsonFields -------------------------------------------------------------------------

JsonFields::JsonFields(const json& object, std::string source, std::string path)
    : object_(&object), source_(std::move(source)), path_(std::move(path)) {
  if (object.is_object()) return;
  if (path_.empty()) {
    throw make_error(source_, ": expected a JSON object at the top level, found ",
                     describe_json_value(object));
  }
  throw error_here("expected an object, found ", describe_json_value(object));
}

std::string JsonFields::path(std::string_view key) const {
  if (!plain_key(key)) return path_ + "['" + std::string(key) + "']";
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

std::string JsonFields::where(std::string_view key) const {
  return field_where(source_, path(key));
}

std::string JsonFields::where() const { return field_where(source_, path_); }

Error JsonFields::missing(std::string_view key, std::string_view what) const {
  return make_error(source_, ": missing required field '", path(key), "' (", what, ")");
}

bool JsonFields::has(std::string_view key) const { return find(key) != nullptr; }

const json* JsonFields::find(std::string_view key) const {
  auto it = object_->find(key);
  return it == object_->end() || it->is_null() ? nullptr : &*it;
}

const json& JsonFields::get(std::string_view key) const { return *object_->find(key); }

std::optional<int64_t> JsonFields::opt_int(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (std::optional<int64_t> i = as_int64(v)) return i;
  if (v.is_number_integer())
    throw error(key, "expected an integer that fits in int64, found ", v.dump());
  throw error(key, "expected an integer, found ", describe_json_value(v));
}

int64_t JsonFields::int_or(std::string_view key, int64_t fallback) const {
  return opt_int(key).value_or(fallback);
}

int64_t JsonFields::req_int(std::string_view key, int64_t min) const {
  std::optional<int64_t> v = opt_int(key);
  if (!v) throw missing(key, "an integer");
  if (*v < min) throw error(key, "expected an integer >= ", min, ", found ", *v);
  return *v;
}

int64_t JsonFields::int_at_least(std::string_view key, int64_t fallback, int64_t min) const {
  int64_t v = int_or(key, fallback);
  if (v < min) throw error(key, "expected an integer >= ", min, ", found ", v);
  return v;
}

std::optional<int64_t> JsonFields::opt_int_in(std::string_view key, int64_t lo, int64_t hi) const {
  std::optional<int64_t> v = opt_int(key);
  if (v && (*v < lo || *v > hi))
    throw error(key, "expected an integer in [", lo, ", ", hi, "], found ", *v);
  return v;
}

int64_t JsonFields::req_size(std::string_view key) const {
  std::optional<int64_t> v = opt_int(key);
  if (!v) throw missing(key, "a positive integer");
  if (*v <= 0) throw error(key, "expected a positive integer, found ", *v);
  // Far above any real model, low enough that products of two sizes cannot overflow int64.
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  if (*v > kMaxSize) throw error(key, "expected a size of at most 2^31, found ", *v);
  return *v;
}

std::optional<double> JsonFields::opt_number(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (!v.is_number()) throw error(key, "expected a number, found ", describe_json_value(v));
  double d = v.get<double>();
  if (!std::isfinite(d)) throw error(key, "expected a finite number, found ", v.dump());
  return d;
}

double JsonFields::number_or(std::string_view key, double fallback) const {
  return opt_number(key).value_or(fallback);
}

double JsonFields::positive_number_or(std::string_view key, double fallback) const {
  double v = number_or(key, fallback);
  if (!(v > 0)) throw error(key, "expected a number > 0, found ", v);
  return v;
}

std::optional<double> JsonFields::opt_number_in(std::string_view key, double lo, double hi) const {
  std::optional<double> v = opt_number(key);
  if (v && !(*v >= lo && *v <= hi))
    throw error(key, "expected a number in [", lo, ", ", hi, "], found ", *v);
  return v;
}

std::optional<bool> JsonFields::opt_bool(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (!v.is_boolean()) throw error(key, "expected true or false, found ", describe_json_value(v));
  return v.get<bool>();
}

bool JsonFields::bool_or(std::string_view key, bool fallback) const {
  return opt_bool(key).value_or(fallback);
}

std::optional<std::string> JsonFields::opt_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (!v.is_string()) throw error(key, "expected a string, found ", describe_json_value(v));
  return v.get<std::string>();
}

std::string JsonFields::req_string(std::string_view key) const {
  std::optional<std::string> v = opt_string(key);
  if (!v) throw missing(key, "a string");
  return std::move(*v);
}

std::optional<std::vector<int64_t>> JsonFields::opt_int_list(std::string_view key,
                                                             int64_t min) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (!v.is_array())
    throw error(key, "expected a list of integers, found ", describe_json_value(v));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    std::optional<int64_t> x = as_int64(v[i]);
    if (!x) {
      throw error(key, "element ", i, ": expected an integer",
                  v[i].is_number_integer() ? " that fits in int64" : "", ", found ",
                  describe_json_value(v[i]));
    }
    if (*x < min) throw error(key, "element ", i, ": expected an integer >= ", min, ", found ", *x);
    out.push_back(*x);
  }
  return out;
}

std::vector<int64_t> JsonFields::int_or_int_list(std::string_view key) const {
  if (!has(key)) return {};
  if (get(key).is_array()) return *opt_int_list(key, 0);
  int64_t v = *opt_int(key);
  if (v < 0) throw error(key, "expected a token id >= 0, found ", v);
  return {v};
}

std::optional<JsonList> JsonFields::opt_list(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (!v.is_array()) throw error(key, "expected a list, found ", describe_json_value(v));
  return JsonList(v, source_, path(key));
}

JsonList JsonFields::req_list(std::string_view key) const {
  std::optional<JsonList> v = opt_list(key);
  if (!v) throw missing(key, "a list");
  return std::move(*v);
}

std::optional<JsonFields> JsonFields::opt_object(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return JsonFields(get(key), source_, path(key));
}

JsonFields JsonFields::req_object(std::string_view key) const {
  std::optional<JsonFields> v = opt_object(key);
  if (!v) throw missing(key, "an object");
  return std::move(*v);
}

// ---- JsonList ---------------------------------------------------------------------------

JsonList::JsonList(const json& array, std::string source, std::string path)
    : array_(&array), source_(std::move(source)), path_(std::move(path)) {
  METRALE_CHECK(array.is_array(), where(), ": expected a list, found ", describe_json_value(array));
}

size_t JsonList::size() const { return array_->size(); }

const json& JsonList::operator[](size_t i) const { return (*array_)[i]; }

std::string JsonList::path(size_t i) const { return path_ + "[" + std::to_string(i) + "]"; }

std::string JsonList::where() const { return field_where(source_, path_); }

std::string JsonList::where(size_t i) const { return field_where(source_, path(i)); }

JsonFields JsonList::object(size_t i) const { return JsonFields((*array_)[i], source_, path(i)); }

std::optional<JsonFields> JsonList::opt_object(size_t i) const {
  if ((*array_)[i].is_null()) return std::nullopt;
  return object(i);
}

std::string JsonList::string(size_t i) const {
  const json& v = (*array_)[i];
  if (!v.is_string()) throw error(i, "expected a string, found ", describe_json_value(v));
  return v.get<std::string>();
}

}  // namespace metrale
