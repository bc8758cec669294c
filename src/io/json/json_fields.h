#pragma once
// Typed reads of the fields of one JSON object from outside: config.json, tokenizer.json,
// tokenizer_config.json, preprocessor configs, safetensors headers and indexes. A wrong type,
// an out-of-range number or a missing key becomes a metrale::Error naming the file, the
// field's path inside it and what was expected versus found, e.g.
//   /ckpt/config.json: field 'text_config.rope_parameters.factor': expected a number > 0, found -1
//   tokenizer.json: field 'pre_tokenizer.pretokenizers[2].behavior': expected a string, found 7
// never a nlohmann exception, a crash or a silently defaulted value.
//
// Absent and null are the same ("use the default"), as in HF's configuration classes. Paths
// join plain keys ([A-Za-z0-9_]+) with dots and quote the others: weight_map['model.norm.weight'].
#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace metrale {

class JsonList;

// A reader over one JSON object; the object must outlive it.
class JsonFields {
 public:
  // `source` names the file; `path` is the object's place inside it ("" at the top level).
  // Throws "<source>: expected a JSON object at the top level, found ..." (or "field '<path>':
  // expected an object, found ...") when `object` is something else.
  JsonFields(const nlohmann::json& object, std::string source, std::string path = "");

  const nlohmann::json& object() const { return *object_; }
  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }
  // A field's path for messages: "text_config.hidden_size".
  std::string path(std::string_view key) const;
  // "<source>: field '<path>'": the start of a message about that field, for messages
  // composed elsewhere (a regex compiler, a semantic check).
  std::string where(std::string_view key) const;
  // The same for the object itself ("<source>" at the top level).
  std::string where() const;

  // "<where(key)>: <what>".
  template <typename... Args>
  Error error(std::string_view key, Args&&... what) const {
    return make_error(where(key), ": ", std::forward<Args>(what)...);
  }
  // "<where()>: <what>": a problem with the object as a whole.
  template <typename... Args>
  Error error_here(Args&&... what) const {
    return make_error(where(), ": ", std::forward<Args>(what)...);
  }
  // "<source>: missing required field '<path>' (<what>)".
  Error missing(std::string_view key, std::string_view what) const;

  // True when the key is present and not null.
  bool has(std::string_view key) const;
  // The value when present and not null, else nullptr: for fields of more than one shape.
  const nlohmann::json* find(std::string_view key) const;

  // Integers: a non-integer (3.5, "3", true) or one outside int64 is an Error.
  std::optional<int64_t> opt_int(std::string_view key) const;
  int64_t int_or(std::string_view key, int64_t fallback) const;
  int64_t req_int(std::string_view key, int64_t min) const;  // present and >= min
  // Present-or-default, then checked >= min.
  int64_t int_at_least(std::string_view key, int64_t fallback, int64_t min) const;
  std::optional<int64_t> opt_int_in(std::string_view key, int64_t lo, int64_t hi) const;
  // A size that decides tensor shapes: present and in (0, 2^31].
  int64_t req_size(std::string_view key) const;

  // Numbers: integers or floats, always finite.
  std::optional<double> opt_number(std::string_view key) const;
  double number_or(std::string_view key, double fallback) const;
  double positive_number_or(std::string_view key, double fallback) const;
  std::optional<double> opt_number_in(std::string_view key, double lo, double hi) const;

  std::optional<bool> opt_bool(std::string_view key) const;
  bool bool_or(std::string_view key, bool fallback) const;

  std::optional<std::string> opt_string(std::string_view key) const;
  std::string req_string(std::string_view key) const;

  // A list of integers, each >= min.
  std::optional<std::vector<int64_t>> opt_int_list(std::string_view key, int64_t min) const;
  // An int or a list of ints (HF's eos_token_id), each >= 0. Absent/null -> empty.
  std::vector<int64_t> int_or_int_list(std::string_view key) const;
  // Any list, read element by element.
  std::optional<JsonList> opt_list(std::string_view key) const;
  JsonList req_list(std::string_view key) const;

  std::optional<JsonFields> opt_object(std::string_view key) const;
  JsonFields req_object(std::string_view key) const;

 private:
  const nlohmann::json& get(std::string_view key) const;  // precondition: has(key)

  const nlohmann::json* object_;  // not owned; a pointer keeps the reader assignable
  std::string source_;
  std::string path_;
};

// A reader over one JSON array (from JsonFields::opt_list / req_list); the array must outlive it.
class JsonList {
 public:
  JsonList(const nlohmann::json& array, std::string source, std::string path);

  size_t size() const;
  const nlohmann::json& operator[](size_t i) const;
  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }  // "model.merges"
  std::string path(size_t i) const;                  // "model.merges[3]"
  std::string where() const;                         // "<source>: field 'model.merges'"
  std::string where(size_t i) const;                 // "<source>: field 'model.merges[3]'"
  template <typename... Args>
  Error error(size_t i, Args&&... what) const {
    return make_error(where(i), ": ", std::forward<Args>(what)...);
  }

  JsonFields object(size_t i) const;                     // an object, or an Error
  std::optional<JsonFields> opt_object(size_t i) const;  // null -> nullopt
  std::string string(size_t i) const;                    // a string, or an Error

 private:
  const nlohmann::json* array_;
  std::string source_;
  std::string path_;
};

// A short rendering of a JSON value for "found ..." in messages (strings quoted, long
// values cut): `7`, `number 3.5`, `string "x"`, `array [1,2]`, `object {...}`, `null`.
std::string describe_json_value(const nlohmann::json& value);

}  // namespace metrale
