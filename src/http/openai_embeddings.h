#pragma once
// POST /v1/embeddings in OpenAI's wire format, without any HTTP: the request body parsed and
// validated (errors are ApiError 400 naming the field, as openai_api.h's), and the response.
//
// Request: {"input": "text" | ["text", ...] | [ids] | [[ids], ...], "model", "encoding_format":
// "float" (default) | "base64", "dimensions", "user"}. Unknown fields are ignored; null is
// absent.
// Response: {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]
// or a base64 string of the little-endian f32 values}], "model", "usage": {"prompt_tokens",
// "total_tokens"}}.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace metrale::http {

inline constexpr size_t kMaxEmbeddingInputs = 2048;  // OpenAI's limit per request

struct EmbeddingsRequest {
  std::string model;                      // "" when absent
  std::vector<std::string> texts;         // the inputs as text (input_is_ids false)
  std::vector<std::vector<int32_t>> ids;  // the inputs as token ids (input_is_ids true)
  bool input_is_ids = false;
  bool base64 = false;     // encoding_format "base64"
  int64_t dimensions = 0;  // 0: absent (the whole embedding)
  std::string user;
  size_t size() const { return input_is_ids ? ids.size() : texts.size(); }
};

// Parses and validates a body (ApiError 400 on any problem: `input` missing, empty, of mixed
// or wrong types, an empty text or id list, more than kMaxEmbeddingInputs inputs; a bad
// encoding_format, dimensions < 1, a user that is not a string).
EmbeddingsRequest parse_embeddings_request(std::string_view body);

// The little-endian bytes of the f32 values, in standard base64 (OpenAI's base64 form).
std::string base64_floats(std::span<const float> values);

// The response object: embeddings in input order.
nlohmann::json embeddings_json(const std::string& model,
                               std::span<const std::vector<float>> embeddings, bool base64,
                               int64_t prompt_tokens);

}  // namespace metrale::http
