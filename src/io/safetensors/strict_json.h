#pragma once
// JSON parsing for checkpoint headers and indexes, stricter than nlohmann's default: a key
// repeated in one object is an error (nlohmann would silently keep the last one, which would
// let two entries for one tensor name disagree unseen), and nesting is bounded so a hostile
// file cannot make us build a deep tree.
#include <nlohmann/json.hpp>
#include <string_view>

namespace metrale::safetensors_detail {

// Parses `text` as one JSON value with at most `max_depth` nested containers (the top-level
// value counts as 1). Throws metrale::Error prefixed by `source` on malformed JSON, a
// duplicate key, or deeper nesting.
nlohmann::json parse_strict_json(std::string_view text, std::string_view source, int max_depth);

}  // namespace metrale::safetensors_detail
