// /v1/embeddings' wire format without a server: every input shape OpenAI accepts, each bad
// body a 400 naming its field, base64 as little-endian f32, and the response object.
#include "http/openai_embeddings.h"

#include <gtest/gtest.h>

#include <cstring>

#include "http/openai_api.h"

namespace metrale::http {
namespace {

using nlohmann::json;

ApiError error_of(const std::string& body) {
  try {
    parse_embeddings_request(body);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "parsed");
}

TEST(EmbeddingsParse, EveryInputShape) {
  EmbeddingsRequest r = parse_embeddings_request(R"({"input": "hello", "model": "m"})");
  EXPECT_EQ(r.texts, std::vector<std::string>{"hello"});
  EXPECT_FALSE(r.input_is_ids);
  EXPECT_EQ(r.model, "m");
  EXPECT_FALSE(r.base64);
  EXPECT_EQ(r.dimensions, 0);
  r = parse_embeddings_request(R"({"input": ["a", "b c"], "encoding_format": "base64"})");
  EXPECT_EQ(r.texts, (std::vector<std::string>{"a", "b c"}));
  EXPECT_TRUE(r.base64);
  r = parse_embeddings_request(R"({"input": [1, 2, 3], "dimensions": 8, "user": "u-1"})");
  EXPECT_TRUE(r.input_is_ids);
  EXPECT_EQ(r.ids, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_EQ(r.dimensions, 8);
  EXPECT_EQ(r.user, "u-1");
  r = parse_embeddings_request(R"({"input": [[1], [2, 3]], "encoding_format": null,
                                   "dimensions": null, "unknown": {"x": 1}})");
  EXPECT_EQ(r.ids, (std::vector<std::vector<int32_t>>{{1}, {2, 3}}));
  EXPECT_EQ(r.size(), 2u);
  EXPECT_FALSE(r.base64);
}

TEST(EmbeddingsParse, BadBodiesAre400NamingTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* message;  // a part of it
  };
  const Case cases[] = {
      {R"({})", "input", "missing required field 'input'"},
      {R"({"input": null})", "input", "missing required field 'input'"},
      {R"({"input": 7})", "input", "expected a string, a list of strings"},
      {R"({"input": []})", "input", "the list of inputs is empty"},
      {R"({"input": ""})", "input", "field 'input': the text is empty"},
      {R"({"input": ["a", ""]})", "input", "field 'input[1]': the text is empty"},
      {R"({"input": ["a", 3]})", "input", "field 'input[1]': expected a string (as input[0])"},
      {R"({"input": [[1], "x"]})", "input",
       "field 'input[1]': expected a list of token ids (as input[0])"},
      {R"({"input": [[1], []]})", "input", "field 'input[1]': the list of token ids is empty"},
      {R"({"input": [1, -2]})", "input", "item 1: expected a token id (an integer >= 0)"},
      {R"({"input": [1, 2.5]})", "input", "item 1: expected a token id"},
      {R"({"input": [1, 4294967296]})", "input", "item 1: expected a token id"},
      {R"({"input": [{"text": "a"}]})", "input",
       "field 'input[0]': expected a string or a list of token ids, found object"},
      {R"({"input": "a", "encoding_format": "hex"})", "encoding_format",
       "expected \"float\" or \"base64\", found \"hex\""},
      {R"({"input": "a", "encoding_format": 1})", "encoding_format", "expected a string"},
      {R"({"input": "a", "dimensions": 0})", "dimensions", "expected an integer >= 1, found 0"},
      {R"({"input": "a", "dimensions": "8"})", "dimensions", "expected an integer"},
      {R"({"input": "a", "model": 3})", "model", "expected a string"},
      {R"({"input": "a", "user": []})", "user", "expected a string"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.body);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
        << c.body << ": " << e.what();
  }
  EXPECT_EQ(error_of("{").code(), "invalid_json");
  EXPECT_EQ(error_of("[1]").status(), 400);
  std::string many = R"({"input": [)";
  for (size_t i = 0; i <= kMaxEmbeddingInputs; ++i) many += std::string(i ? "," : "") + "\"a\"";
  many += "]}";
  EXPECT_NE(std::string(error_of(many).what()).find("at most 2048 inputs, found 2049"),
            std::string::npos);
}

TEST(EmbeddingsResponse, Base64IsLittleEndianF32) {
  const std::vector<float> v = {1.0f, -2.5f, 0.1f};
  const std::string b = base64_floats(v);
  EXPECT_EQ(b.size(), 16u);  // 12 bytes -> 16 characters
  // 1.0f = 00 00 80 3f, -2.5f = 00 00 20 c0, 0.1f = cd cc cc 3d.
  EXPECT_EQ(b, "AACAPwAAIMDNzMw9");
  EXPECT_EQ(base64_floats(std::vector<float>{1.0f}), "AACAPw==");
  const std::vector<float> one = {1.0f};
  const json j = embeddings_json("m", std::vector<std::vector<float>>{v, one}, false, 7);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "m");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][1]["object"], "embedding");
  EXPECT_EQ(j["data"][1]["index"], 1);
  EXPECT_EQ(j["data"][0]["embedding"][1].get<float>(), -2.5f);
  EXPECT_EQ(j["data"][0]["embedding"][2].get<float>(), 0.1f);  // exact
  EXPECT_EQ(j["usage"], (json{{"prompt_tokens", 7}, {"total_tokens", 7}}));
  const json b64 = embeddings_json("m", std::vector<std::vector<float>>{v}, true, 3);
  EXPECT_EQ(b64["data"][0]["embedding"], "AACAPwAAIMDNzMw9");
}

}  // namespace
}  // namespace metrale::http
