#include "io/config/json_fields.h"

#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

namespace metrale::config_detail {

using nlohmann::json;

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

JsonFields::JsonFields(const json& object, std::string source, std::string prefix)
    : object_(&object), source_(std::move(source)), prefix_(std::move(prefix)) {}

bool JsonFields::has(std::string_view key) const {
  auto it = object_->find(key);
  return it != object_->end() && !it->is_null();
}

std::string JsonFields::path(std::string_view key) const { return prefix_ + std::string(key); }

const json& JsonFields::get(std::string_view key) const { return *object_->find(key); }

std::optional<int64_t> JsonFields::opt_int(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw error(key, "expected an integer that fits in int64, found ", v.dump());
    }
    return v.get<int64_t>();
  }
  throw error(key, "expected an integer, found ", describe_json_value(v));
}

int64_t JsonFields::int_or(std::string_view key, int64_t fallback) const {
  return opt_int(key).value_or(fallback);
}

int64_t JsonFields::req_size(std::string_view key) const {
  std::optional<int64_t> v = opt_int(key);
  if (!v) throw make_error(source_, ": missing required field '", path(key), "' (a positive integer)");
  if (*v <= 0) throw error(key, "expected a positive integer, found ", *v);
  // Far above any real model, low enough that products of two sizes cannot overflow int64.
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  if (*v > kMaxSize) throw error(key, "expected a size of at most 2^31, found ", *v);
  return *v;
}

int64_t JsonFields::int_at_least(std::string_view key, int64_t fallback, int64_t min) const {
  int64_t v = int_or(key, fallback);
  if (v < min) throw error(key, "expected an integer >= ", min, ", found ", v);
  return v;
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

std::optional<std::vector<int64_t>> JsonFields::opt_int_list(std::string_view key, int64_t min) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (!v.is_array()) throw error(key, "expected a list of integers, found ", describe_json_value(v));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_number_integer() ||
        (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      throw error(key, "element ", i, ": expected an integer, found ", describe_json_value(e));
    }
    int64_t x = e.get<int64_t>();
    if (x < min) throw error(key, "element ", i, ": expected an integer >= ", min, ", found ", x);
    out.push_back(x);
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

std::optional<JsonFields> JsonFields::opt_object(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = get(key);
  if (!v.is_object()) throw error(key, "expected an object, found ", describe_json_value(v));
  return JsonFields(v, source_, path(key) + ".");
}

}  // namespace metrale::config_detail
