#pragma once
// Typed reads of one JSON object's fields, each failure naming the file, the dotted field path
// and what was expected versus found. config.json is outside input: a wrong type, a negative
// size or a missing key must become a metrale::Error, never a nlohmann exception or a guess.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"

namespace metrale::config_detail {

class JsonFields {
 public:
  // `object` must outlive this reader. `source` names the file; `prefix` is the path of
  // `object` inside it ("" at the root, "text_config." for a nested text model).
  JsonFields(const nlohmann::json& object, std::string source, std::string prefix);

  const nlohmann::json& object() const { return *object_; }
  const std::string& source() const { return source_; }

  // True when the key is present and not null. HF treats an explicit null as "absent".
  bool has(std::string_view key) const;
  // The dotted name of a field for messages: "text_config.hidden_size".
  std::string path(std::string_view key) const;
  // An Error "<source>: field '<path>': <what>".
  template <typename... Args>
  Error error(std::string_view key, Args&&... what) const {
    return make_error(source_, ": field '", path(key), "': ", std::forward<Args>(what)...);
  }

  // Integers. Absent/null -> nullopt; a non-integer (3.5, "3", true) -> Error.
  std::optional<int64_t> opt_int(std::string_view key) const;
  int64_t int_or(std::string_view key, int64_t fallback) const;
  // A size that decides tensor shapes: must be present and > 0.
  int64_t req_size(std::string_view key) const;
  // Present-or-default, then checked >= min.
  int64_t int_at_least(std::string_view key, int64_t fallback, int64_t min) const;

  std::optional<double> opt_number(std::string_view key) const;
  double number_or(std::string_view key, double fallback) const;
  double positive_number_or(std::string_view key, double fallback) const;

  std::optional<bool> opt_bool(std::string_view key) const;
  bool bool_or(std::string_view key, bool fallback) const;

  std::optional<std::string> opt_string(std::string_view key) const;

  // A list of integers (each checked >= min). Absent/null -> nullopt.
  std::optional<std::vector<int64_t>> opt_int_list(std::string_view key, int64_t min) const;
  // An int or a list of ints (HF's eos_token_id). Absent/null -> empty.
  std::vector<int64_t> int_or_int_list(std::string_view key) const;

  // A nested object; absent/null -> nullopt, anything but an object -> Error.
  std::optional<JsonFields> opt_object(std::string_view key) const;

 private:
  const nlohmann::json& get(std::string_view key) const;  // precondition: has(key)

  const nlohmann::json* object_;  // not owned; a pointer keeps the reader assignable
  std::string source_;
  std::string prefix_;
};

// A short rendering of a JSON value for "found ..." in messages (strings quoted, long
// values cut).
std::string describe_json_value(const nlohmann::json& value);

}  // namespace metrale::config_detail
