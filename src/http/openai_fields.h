#pragma once
// Helpers the two halves of the OpenAI wire format (openai_request.cc, openai_response.cc)
// share: how a body is parsed and a field read, so that every failure is an ApiError naming the
// field, and a token's text as the API lists it. Internal to metrale_http.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "http/openai_api.h"
#include "io/json/json_parse.h"
#include "io/tokenizer/tokenizer.h"

namespace metrale::http::fields {

using nlohmann::json;

inline constexpr std::string_view kSource = "request body";

// Runs a JsonFields read of `key`; its Error (naming the field, expected vs found) becomes
// a 400 whose param is the field.
template <typename F>
auto field(std::string_view key, F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, e.message(), std::string(key));
  }
}

inline ApiError bad(std::string_view key, std::string message) {
  return ApiError(400, std::string(kSource) + ": field '" + std::string(key) + "': " + message,
                  std::string(key));
}

inline ApiError unsupported(std::string_view key, std::string message) {
  return ApiError(400, std::string(kSource) + ": field '" + std::string(key) + "': " + message,
                  std::string(key), "", "unsupported_parameter");
}

// A JSON object key for an error message: at most 32 bytes of it.
inline std::string describe_key(const std::string& key) {
  return key.size() <= 32 ? key : key.substr(0, 32) + "...";
}

inline json parse_body(std::string_view body) {
  try {
    return parse_json(body, kSource);
  } catch (const Error& e) {
    throw ApiError(400, e.message(), "", "", "invalid_json");
  }
}

// A token's text: its bytes as the tokenizer decodes them alone (possibly part of a UTF-8
// character; JSON dumping replaces what is invalid, `bytes` keeps them exact).
inline std::string token_text(const Tokenizer& tok, int32_t id) {
  try {
    const int32_t ids[1] = {id};
    return tok.decode(ids, /*skip_special_tokens=*/false);
  } catch (const Error&) {
    return "";  // an id the model has but the tokenizer lacks (a padded embedding table)
  }
}

inline json bytes_of(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

}  // namespace metrale::http::fields
