#include "io/safetensors/strict_json.h"

#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace metrale::safetensors_detail {

using nlohmann::json;

namespace {

// A first, validating pass over the text. It is a SAX handler rather than nlohmann's parse
// callback because the callback parser rescans the enclosing object at every object end,
// which is quadratic in the number of tensors (minutes for a 50k-tensor header).
class Validator : public nlohmann::json_sax<json> {
 public:
  Validator(std::string_view source, int max_depth) : source_(source), max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (open_.size() == 1) top_key_ = k;
    if (!open_.back().insert(k).second) {
      if (open_.size() == 1) throw make_error(source_, ": duplicate key '", k, "'");
      throw make_error(source_, ": duplicate key '", k, "' inside '", top_key_, "'");
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw make_error(source_, ": not valid JSON (", e.what(), ")");
  }

 private:
  bool open(bool) {
    if (static_cast<int>(open_.size()) + 1 > max_depth_) {
      if (open_.empty())
        throw make_error(source_, ": JSON nesting deeper than ", max_depth_, " levels");
      throw make_error(source_, ": JSON nesting deeper than ", max_depth_, " levels under key '",
                       top_key_, "'");
    }
    open_.emplace_back();  // arrays get an (unused) set too, so the stack tracks nesting
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::string_view source_;
  int max_depth_;
  std::vector<std::set<std::string>> open_;
  std::string top_key_;  // the top-level key being parsed, for messages
};

}  // namespace

nlohmann::json parse_strict_json(std::string_view text, std::string_view source, int max_depth) {
  Validator validator(source, max_depth);
  json::sax_parse(text.begin(), text.end(), &validator, nlohmann::detail::input_format_t::json,
                  /*strict=*/true, /*ignore_comments=*/false);
  // The text is now known to be well-formed, shallow and free of duplicate keys.
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw make_error(source, ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace metrale::safetensors_detail
