#include "io/json/json_parse.h"

#include <cstddef>
#include <string>

#include "core/error.h"

namespace metrale {
namespace {

// nlohmann's own DOM builder (what json::parse uses), with a depth count in front.
class DepthLimitedDom {
 public:
  using json = nlohmann::json;
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  DepthLimitedDom(json& result, std::string_view source, int max_depth)
      : dom_(result, /*allow_exceptions=*/true), source_(source), max_depth_(max_depth) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) { return dom_.number_float(v, s); }
  bool string(string_t& v) { return dom_.string(v); }
  bool binary(binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) { return enter() && dom_.start_object(n); }
  bool key(string_t& k) { return dom_.key(k); }
  bool end_object() { return leave() && dom_.end_object(); }
  bool start_array(std::size_t n) { return enter() && dom_.start_array(n); }
  bool end_array() { return leave() && dom_.end_array(); }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw make_error(source_, ": malformed JSON: ", e.what());
  }

 private:
  bool enter() {
    if (++depth_ > max_depth_) {
      throw make_error(source_, ": JSON nesting deeper than ", max_depth_, " levels");
    }
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::string_view source_;
  int max_depth_;
  int depth_ = 0;
};

}  // namespace

nlohmann::json parse_json(std::string_view text, std::string_view source, int max_depth) {
  nlohmann::json result;
  DepthLimitedDom handler(result, source, max_depth);
  nlohmann::json::sax_parse(text.begin(), text.end(), &handler,
                            nlohmann::json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  return result;
}

}  // namespace metrale
