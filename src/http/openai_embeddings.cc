#include "http/openai_embeddings.h"

#include <bit>
#include <cstring>

#include "http/openai_api.h"
#include "io/json/json_fields.h"
#include "io/json/json_parse.h"

namespace metrale::http {
namespace {

using nlohmann::json;
constexpr std::string_view kSource = "request body";

// A 400 about `key` ("input[3]"); its param is the top-level field ("input").
ApiError bad(std::string_view key, const std::string& message) {
  const std::string_view param = key.substr(0, key.find('['));
  return ApiError(400, std::string(kSource) + ": field '" + std::string(key) + "': " + message,
                  std::string(param));
}

// Token ids of input `where` ("input", "input[3]").
std::vector<int32_t> read_ids(const json& list, const std::string& where) {
  if (list.empty()) throw bad(where, "the list of token ids is empty");
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& id = list[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > int64_t{INT32_MAX}) {
      throw bad(where, "item " + std::to_string(i) +
                           ": expected a token id (an integer >= 0), found " +
                           describe_json_value(id));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

}  // namespace

EmbeddingsRequest parse_embeddings_request(std::string_view body) {
  json doc;
  try {
    doc = parse_json(body, kSource);
  } catch (const Error& e) {
    throw ApiError(400, e.message(), "", "", "invalid_json");
  }
  if (!doc.is_object()) {
    throw ApiError(
        400, std::string(kSource) + ": expected a JSON object, found " + describe_json_value(doc));
  }
  const JsonFields f(doc, std::string(kSource));
  auto field = [](std::string_view key, auto&& read) {
    try {
      return read();
    } catch (const Error& e) {
      throw ApiError(400, e.message(), std::string(key));
    }
  };
  EmbeddingsRequest r;
  r.model = field("model", [&] { return f.opt_string("model"); }).value_or("");
  r.user = field("user", [&] { return f.opt_string("user"); }).value_or("");
  const std::string format =
      field("encoding_format", [&] { return f.opt_string("encoding_format"); }).value_or("float");
  if (format != "float" && format != "base64")
    throw bad("encoding_format", "expected \"float\" or \"base64\", found \"" + format + "\"");
  r.base64 = format == "base64";
  r.dimensions = field("dimensions", [&] { return f.opt_int("dimensions"); }).value_or(0);
  if (f.has("dimensions") && r.dimensions < 1)
    throw bad("dimensions", "expected an integer >= 1, found " + std::to_string(r.dimensions));

  const json* input = f.find("input");
  if (input == nullptr) {
    throw ApiError(400,
                   f.missing("input",
                             "a string, a list of strings, a list of token ids or "
                             "a list of lists of token ids")
                       .message(),
                   "input");
  }
  if (input->is_string()) {
    r.texts.push_back(input->get<std::string>());
  } else if (input->is_array() && !input->empty() && (*input)[0].is_number()) {
    r.ids.push_back(read_ids(*input, "input"));
    r.input_is_ids = true;
  } else if (input->is_array() && !input->empty()) {
    if (input->size() > kMaxEmbeddingInputs) {
      throw bad("input", "at most " + std::to_string(kMaxEmbeddingInputs) + " inputs, found " +
                             std::to_string(input->size()));
    }
    r.input_is_ids = (*input)[0].is_array();
    for (size_t i = 0; i < input->size(); ++i) {
      const json& one = (*input)[i];
      const std::string where = "input[" + std::to_string(i) + "]";
      if (r.input_is_ids && one.is_array()) {
        r.ids.push_back(read_ids(one, where));
      } else if (!r.input_is_ids && one.is_string()) {
        r.texts.push_back(one.get<std::string>());
      } else if (i == 0) {
        throw bad(where,
                  "expected a string or a list of token ids, found " + describe_json_value(one));
      } else {
        throw bad(where, std::string("expected ") +
                             (r.input_is_ids ? "a list of token ids (as input[0])"
                                             : "a string (as input[0])") +
                             ", found " + describe_json_value(one));
      }
    }
  } else {
    throw bad("input", input->is_array()
                           ? "the list of inputs is empty"
                           : "expected a string, a list of strings, a list of token ids or a "
                             "list of lists of token ids, found " +
                                 describe_json_value(*input));
  }
  for (size_t i = 0; i < r.texts.size(); ++i) {
    if (r.texts[i].empty()) {
      throw bad(
          r.texts.size() == 1 && input->is_string() ? "input" : "input[" + std::to_string(i) + "]",
          "the text is empty");
    }
  }
  return r;
}

std::string base64_floats(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian");
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  const size_t n = values.size_bytes();
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t b0 = bytes[i];
    const uint32_t b1 = i + 1 < n ? bytes[i + 1] : 0;
    const uint32_t b2 = i + 2 < n ? bytes[i + 2] : 0;
    const uint32_t v = (b0 << 16) | (b1 << 8) | b2;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back(i + 2 < n ? kAlphabet[v & 63] : '=');
  }
  return out;
}

json embeddings_json(const std::string& model, std::span<const std::vector<float>> embeddings,
                     bool base64, int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    json e = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      e["embedding"] = base64_floats(embeddings[i]);
    } else {
      e["embedding"] = embeddings[i];
    }
    data.push_back(std::move(e));
  }
  return json{{"object", "list"},
              {"data", std::move(data)},
              {"model", model},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace metrale::http
