#pragma once
// The values a chat template computes with, modelled on the Python objects jinja2 sees when
// transformers renders a template: undefined, None, bool, int, float, str, list, dict (insertion
// ordered, string keys), and callables (macros, globals). Lists and dicts are shared by
// reference, as in Python, so `ns.x = ...` and `list.append(...)` are seen by every holder.
//
// `str_of` and `repr_of` print exactly what Python's str() / repr() print for these types
// (`True`, `None`, `1.0`, `1e-05`, `['a', {'b': 1}]`): templates render lists and tool
// arguments through them.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace metrale::chat {

class Value;

// jinja2's default Undefined: falsy, renders as "", iterates as empty; arithmetic, attribute
// access and calls on it fail naming what was undefined.
struct Undefined {
  std::string hint;  // "'x' is undefined", "'dict object' has no attribute 'y'"
};
struct None {};

// The Python sequence types a template meets, told apart where jinja2 tells them apart:
// a tuple prints as (..); the generators that map / select / reject / selectattr / rejectattr /
// items / unique / reverse return are truthy even when empty and have no len(), no index and no
// JSON form; dict.items() / keys() / values() views print as dict_items([...]) and have no
// index or JSON form; a range has no JSON form.
enum class SeqKind : uint8_t {
  kList,
  kTuple,
  kGenerator,
  kDictItems,
  kDictKeys,
  kDictValues,
  kRange
};

struct List;
class Dict;
struct Function;

// An error without a position yet: thrown by value operations and builtins, turned into a
// metrale::Error naming the template source, line and column by the interpreter.
class RenderFailure {
 public:
  explicit RenderFailure(std::string message) : message_(std::move(message)) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

class Value {
 public:
  using Storage =
      std::variant<Undefined, None, bool, int64_t, double, std::shared_ptr<const std::string>,
                   std::shared_ptr<List>, std::shared_ptr<Dict>, std::shared_ptr<const Function>>;

  Value() : v_(Undefined{}) {}
  Value(None n) : v_(n) {}  // NOLINT(google-explicit-constructor): literals read naturally
  Value(Undefined u) : v_(std::move(u)) {}
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  // Strings are shared, never changed: copying a Value never copies its text.
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : v_(std::make_shared<const std::string>(s)) {}
  Value(std::shared_ptr<List> l) : v_(std::move(l)) {}
  Value(std::shared_ptr<Dict> d) : v_(std::move(d)) {}
  Value(std::shared_ptr<const Function> f) : v_(std::move(f)) {}

  static Value list(List items);
  static Value list();
  static Value tuple(List items);
  static Value seq(List items, SeqKind kind);
  static Value dict();
  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  // markupsafe's Markup (what |safe and |escape return): `markup + str` escapes the str.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  bool is_markup() const { return markup_ && is_string(); }

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return std::holds_alternative<std::shared_ptr<const std::string>>(v_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(v_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<const Function>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  List& as_list() const { return *std::get<std::shared_ptr<List>>(v_); }
  Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<const Function>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }
  const Storage& storage() const { return v_; }

 private:
  Storage v_;
  bool markup_ = false;
};

struct List : std::vector<Value> {
  using std::vector<Value>::vector;
  SeqKind kind = SeqKind::kList;
  bool is_tuple() const { return kind == SeqKind::kTuple; }
  // list or tuple (or range): what supports len(), indexing and slicing.
  bool indexable() const {
    return kind == SeqKind::kList || kind == SeqKind::kTuple || kind == SeqKind::kRange;
  }
};
const char* seq_type_name(SeqKind kind);

// An insertion-ordered dict with string keys (the JSON objects and dict literals of templates).
class Dict {
 public:
  const Value* find(std::string_view key) const;  // a string key
  Value* find(std::string_view key);
  // A str or int key (a bool counts as its int, an integral float as that int, as in Python);
  // nullptr for keys of other types.
  const Value* find(const Value& key) const;
  // Replaces the value of an existing key in place (keeping its position), else appends.
  void set(const std::string& key, Value value);
  // A str, int, bool or integral float key; RenderFailure for others.
  void set_key(const Value& key, Value value);
  // The i-th key as a Value: str, or int for the int keys of a dict literal ({0: 'a'}).
  Value key(size_t i) const;
  size_t size() const { return items_.size(); }
  void clear() {
    items_.clear();
    int_key_.clear();
    index_.clear();
  }
  // Keys as text: an int key as its decimal digits (what JSON writes for it).
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }

  bool is_namespace = false;  // namespace(): the only object `{% set ns.x = ... %}` may change

 private:
  std::vector<std::pair<std::string, Value>> items_;
  std::vector<bool> int_key_;
  std::unordered_map<std::string, size_t> index_;  // "s" + string key, "i" + int key
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A native function or a macro. Failures are thrown as RenderFailure (above); the interpreter
// adds the template position.
struct Function {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

inline Value Value::list(List items) { return Value(std::make_shared<List>(std::move(items))); }
inline Value Value::tuple(List items) { return seq(std::move(items), SeqKind::kTuple); }
inline Value Value::seq(List items, SeqKind kind) {
  items.kind = kind;
  return list(std::move(items));
}
inline Value Value::list() { return list(List()); }
inline Value Value::dict() { return Value(std::make_shared<Dict>()); }

// Python's name of the value's type, as jinja2 messages use it ("dict object", "str").
std::string type_name(const Value& v);
// Python truthiness; undefined is false.
bool truthy(const Value& v);
// What str_of / repr_of / json_dumps build at most unless told otherwise (a list repeated
// many times over could otherwise print to terabytes).
inline constexpr size_t kMaxPrintBytes = size_t{64} << 20;

// Python str() (undefined -> ""). Throws RenderFailure on a structure nested too deeply or
// printing to more than `max_bytes`.
std::string str_of(const Value& v, size_t max_bytes = kMaxPrintBytes);
// Python repr().
std::string repr_of(const Value& v, size_t max_bytes = kMaxPrintBytes);
// Python float repr: shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf", "nan".
std::string float_repr(double d);
// Python ==, with jinja2's undefined == undefined.
bool equals(const Value& a, const Value& b);
// Python <; RenderFailure when the types do not order ("'<' not supported ...").
bool less_than(const Value& a, const Value& b);
// Numeric value of an int, float or bool (caller checked is_number()).
double to_double(const Value& v);

struct JsonDumpOptions {
  std::optional<int64_t> indent;  // None: one line
  bool ensure_ascii = false;      // transformers' tojson default (jinja2's own escapes HTML)
  std::string item_separator;     // ", " (or "," with an indent) unless given
  std::string key_separator = ": ";
  bool sort_keys = false;
  size_t max_bytes = kMaxPrintBytes;  // a RenderFailure beyond this
};
// Python json.dumps with these options (floats as repr, NaN/Infinity as Python writes them).
// Fails on undefined, callables and nesting deeper than the JSON input limit allows.
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

// Parses JSON text into Values keeping object key order (Python's json.loads: a repeated
// key keeps its first position and its last value). Errors name `source`.
Value value_from_json(std::string_view text, std::string_view source);

}  // namespace metrale::chat
