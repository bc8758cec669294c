// parse_json: the same document as nlohmann::json::parse for valid input, and an Error naming
// the source (never a crash) for malformed or absurdly nested input.
#include "io/json/json_parse.h"

#include <gtest/gtest.h>

#include <string>

#include "support/test_support.h"

namespace metrale {
namespace {

std::string nested_arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(ParseJson, EqualsNlohmannOnValidInput) {
  const std::string text =
      R"({"a": [1, -2, 3.5, 1e300, 18446744073709551615, "\u00e9\ud83d\ude00"], "b": {"c": null, "d": [true, false]},)"
      R"( "e": {}, "f": [], "a2": "x"})";
  EXPECT_EQ(parse_json(text, "t.json"), nlohmann::json::parse(text));
  EXPECT_EQ(parse_json("  7 ", "t.json"), nlohmann::json(7));
}

TEST(ParseJson, MalformedInputNamesTheSource) {
  for (const std::string text :
       {"", "{", "{\"a\": 1} trailing", "[1,]", "{\"\xff\": 1}", "// c\n{}"}) {
    SCOPED_TRACE(text);
    const std::string msg = test::error_of([&] { parse_json(text, "dir/t.json"); });
    EXPECT_EQ(0u, msg.find("dir/t.json: malformed JSON")) << msg;
  }
}

TEST(ParseJson, NestingIsLimited) {
  EXPECT_NO_THROW(parse_json(nested_arrays(kMaxJsonDepth), "t.json"));
  EXPECT_NO_THROW(parse_json("{\"a\":" + nested_arrays(3) + "}", "t.json", 4));
  std::string msg =
      test::error_of([&] { parse_json("{\"a\":" + nested_arrays(4) + "}", "t.json", 4); });
  EXPECT_EQ(0u, msg.find("t.json: JSON nesting deeper than 4 levels")) << msg;
  // Deep enough to overflow the stack in a recursive dump() or copy: rejected while parsing.
  msg = test::error_of([&] { parse_json(nested_arrays(200000), "deep.json"); });
  EXPECT_EQ(0u, msg.find("deep.json: JSON nesting deeper than")) << msg;
}

}  // namespace
}  // namespace metrale
