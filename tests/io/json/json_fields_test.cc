// JsonFields / JsonList: every failure names the file, the field's path and expected versus
// found; absent and null read as "use the default".
#include "io/json/json_fields.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "io/json/json_parse.h"
#include "support/test_support.h"

namespace metrale {
namespace {

using nlohmann::json;

const json& doc() {
  static const json kDoc = parse_json(R"({
    "n": 7, "big": 18446744073709551615, "x": 2.5, "s": "str", "b": true, "nil": null,
    "ids": [1, 2, -3], "obj": {"inner": {"k": "v"}, "list": [{"type": "A"}, null, 5]},
    "map": {"model.norm.weight": 1}
  })",
                                      "cfg.json");
  return kDoc;
}

JsonFields top() { return JsonFields(doc(), "cfg.json"); }

TEST(JsonFields, TopLevelMustBeAnObject) {
  const json arr = json::array({1});
  EXPECT_EQ(test::error_of([&] { JsonFields(arr, "a.json"); }),
            "a.json: expected a JSON object at the top level, found array [1]");
}

TEST(JsonFields, AbsentAndNullAreDefaults) {
  const JsonFields f = top();
  EXPECT_FALSE(f.has("nil"));
  EXPECT_FALSE(f.has("absent"));
  EXPECT_EQ(f.int_or("nil", 4), 4);
  EXPECT_EQ(f.opt_string("absent"), std::nullopt);
  EXPECT_EQ(f.find("nil"), nullptr);
  EXPECT_EQ(f.int_or("n", 4), 7);
  EXPECT_EQ(f.bool_or("b", false), true);
  EXPECT_EQ(f.number_or("x", 0), 2.5);
  EXPECT_EQ(f.req_string("s"), "str");
}

TEST(JsonFields, WrongTypesNameFieldExpectedAndFound) {
  const JsonFields f = top();
  EXPECT_EQ(test::error_of([&] { f.opt_int("s"); }),
            "cfg.json: field 's': expected an integer, found string \"str\"");
  EXPECT_EQ(test::error_of([&] { f.opt_int("x"); }),
            "cfg.json: field 'x': expected an integer, found number 2.5");
  EXPECT_EQ(
      test::error_of([&] { f.opt_int("big"); }),
      "cfg.json: field 'big': expected an integer that fits in int64, found 18446744073709551615");
  EXPECT_EQ(test::error_of([&] { f.opt_bool("n"); }),
            "cfg.json: field 'n': expected true or false, found 7");
  EXPECT_EQ(test::error_of([&] { f.opt_string("b"); }),
            "cfg.json: field 'b': expected a string, found true");
  EXPECT_EQ(test::error_of([&] { f.opt_number("s"); }),
            "cfg.json: field 's': expected a number, found string \"str\"");
  EXPECT_EQ(test::error_of([&] { f.opt_object("n"); }),
            "cfg.json: field 'n': expected an object, found 7");
  EXPECT_EQ(test::error_of([&] { f.opt_list("n"); }),
            "cfg.json: field 'n': expected a list, found 7");
}

TEST(JsonFields, RangesAndMissingFields) {
  const JsonFields f = top();
  EXPECT_EQ(test::error_of([&] { f.req_size("absent"); }),
            "cfg.json: missing required field 'absent' (a positive integer)");
  EXPECT_EQ(test::error_of([&] { f.req_string("nil"); }),
            "cfg.json: missing required field 'nil' (a string)");
  EXPECT_EQ(test::error_of([&] { f.req_int("n", 8); }),
            "cfg.json: field 'n': expected an integer >= 8, found 7");
  EXPECT_EQ(test::error_of([&] { f.opt_int_in("n", 0, 5); }),
            "cfg.json: field 'n': expected an integer in [0, 5], found 7");
  EXPECT_EQ(test::error_of([&] { f.opt_number_in("x", 3, 4); }),
            "cfg.json: field 'x': expected a number in [3, 4], found 2.5");
  EXPECT_EQ(test::error_of([&] { f.opt_int_list("ids", 0); }),
            "cfg.json: field 'ids': element 2: expected an integer >= 0, found -3");
  EXPECT_EQ(f.opt_int_list("ids", -5), (std::vector<int64_t>{1, 2, -3}));
}

TEST(JsonFields, NestedPathsAndLists) {
  const JsonFields obj = top().req_object("obj");
  EXPECT_EQ(obj.path(), "obj");
  EXPECT_EQ(obj.req_object("inner").path("k"), "obj.inner.k");
  EXPECT_EQ(test::error_of([&] { obj.req_object("inner").opt_int("k"); }),
            "cfg.json: field 'obj.inner.k': expected an integer, found string \"v\"");
  const JsonList list = obj.req_list("list");
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list.object(0).req_string("type"), "A");
  EXPECT_EQ(list.object(0).where("type"), "cfg.json: field 'obj.list[0].type'");
  EXPECT_FALSE(list.opt_object(1).has_value());
  EXPECT_EQ(test::error_of([&] { list.object(2); }),
            "cfg.json: field 'obj.list[2]': expected an object, found 5");
  EXPECT_EQ(test::error_of([&] { list.string(2); }),
            "cfg.json: field 'obj.list[2]': expected a string, found 5");
  EXPECT_EQ(list.error(1, "custom").message(), "cfg.json: field 'obj.list[1]': custom");
}

TEST(JsonFields, KeysThatAreNotIdentifiersAreQuoted) {
  const JsonFields map = top().req_object("map");
  EXPECT_EQ(map.path("model.norm.weight"), "map['model.norm.weight']");
  EXPECT_EQ(test::error_of([&] { map.opt_string("model.norm.weight"); }),
            "cfg.json: field 'map['model.norm.weight']': expected a string, found 1");
  EXPECT_EQ(map.error_here("empty").message(), "cfg.json: field 'map': empty");
  EXPECT_EQ(top().error_here("bad").message(), "cfg.json: bad");
}

TEST(JsonFields, LongValuesAreCutInMessages) {
  const json long_list = json(std::vector<int>(100, 12345));
  const std::string text = describe_json_value(long_list);
  EXPECT_EQ(text.rfind("array [12345,", 0), 0u) << text;
  EXPECT_LE(text.size(), 63u) << text;
}

}  // namespace
}  // namespace metrale
