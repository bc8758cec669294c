// JSON text -> Values through nlohmann's SAX interface: object keys keep their order (nlohmann's
// DOM sorts them, and transformers' tojson prints tools in the order the request gave them).
#include <cstddef>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/value.h"
#include "core/error.h"
#include "io/json/json_parse.h"

namespace metrale::chat {
namespace {

class ValueBuilder {
 public:
  using json = nlohmann::json;

  explicit ValueBuilder(std::string_view source) : source_(source) {}

  bool null() { return put(Value(None{})); }
  bool boolean(bool v) { return put(Value(v)); }
  bool number_integer(json::number_integer_t v) { return put(Value(static_cast<int64_t>(v))); }
  bool number_unsigned(json::number_unsigned_t v) {
    if (v > static_cast<json::number_unsigned_t>(std::numeric_limits<int64_t>::max())) {
      throw make_error(source_, ": integer ", v, " is out of the supported range (int64)");
    }
    return put(Value(static_cast<int64_t>(v)));
  }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(Value(v)); }
  bool string(json::string_t& v) { return put(Value(std::move(v))); }
  bool binary(json::binary_t&) { throw make_error(source_, ": binary values are not JSON"); }
  bool start_object(std::size_t) { return open(Value::dict()); }
  bool key(json::string_t& k) {
    keys_.back() = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(Value::list()); }
  bool end_array() { return close(); }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw make_error(source_, ": malformed JSON: ", e.what());
  }

  Value result() { return std::move(result_); }

 private:
  bool put(Value v) {
    if (stack_.empty()) {
      result_ = std::move(v);
    } else if (stack_.back().is_list()) {
      stack_.back().as_list().push_back(std::move(v));
    } else {
      stack_.back().as_dict().set(keys_.back(), std::move(v));
    }
    return true;
  }
  bool open(Value container) {
    if (static_cast<int>(stack_.size()) >= kMaxJsonDepth) {
      throw make_error(source_, ": JSON nesting deeper than ", kMaxJsonDepth, " levels");
    }
    put(container);
    stack_.push_back(std::move(container));
    keys_.emplace_back();
    return true;
  }
  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  std::string_view source_;
  std::vector<Value> stack_;
  std::vector<std::string> keys_;
  Value result_;
};

}  // namespace

Value value_from_json(std::string_view text, std::string_view source) {
  ValueBuilder builder(source);
  nlohmann::json::sax_parse(text.begin(), text.end(), &builder,
                            nlohmann::json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  return builder.result();
}

}  // namespace metrale::chat
