#pragma once
// JSON from outside (config.json, tokenizer.json, tokenizer_config.json, preprocessor configs)
// parsed with a nesting limit. nlohmann parses iteratively, but dump(), copies and comparisons
// recurse, so a 100k-deep `[[[[...]]]]` in any field that an error message quotes overflowed
// the stack (found by fuzz/model_config_fuzz). Real files nest a handful of levels.
// (safetensors headers and indexes have their own, stricter parser: io/safetensors/strict_json.h.)
#include <nlohmann/json.hpp>
#include <string_view>

namespace metrale {

inline constexpr int kMaxJsonDepth = 64;

// Parses `text` exactly as nlohmann::json::parse does (strict, no comments). Throws an Error
// naming `source`: "malformed JSON: ..." or "JSON nesting deeper than N levels".
nlohmann::json parse_json(std::string_view text, std::string_view source,
                          int max_depth = kMaxJsonDepth);

}  // namespace metrale
