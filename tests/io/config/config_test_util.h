#pragma once
// Shared helpers for the io/config tests: committed fixtures, the variants' JSON-pointer edits
// (the same ones tools/fixtures/configs/make_expectations.py applies) and error capture.
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config/model_config.h"
#include "support/test_support.h"

namespace metrale::test {

inline const char* kConfigsDir = "tests/data/configs";

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

inline nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_text(path));
}

inline const nlohmann::json& expectations() {
  static const nlohmann::json kDoc = read_json(std::string(kConfigsDir) + "/expectations.json");
  return kDoc;
}

// variants.json: start from <base>/config.json, set JSON-pointer paths, remove others.
inline nlohmann::json apply_variant(nlohmann::json doc, const nlohmann::json& variant) {
  if (variant.contains("set")) {
    for (const auto& [pointer, value] : variant["set"].items())
      doc[nlohmann::json::json_pointer(pointer)] = value;
  }
  if (variant.contains("remove")) {
    for (const auto& pointer : variant["remove"]) {
      nlohmann::json::json_pointer p(pointer.get<std::string>());
      doc[p.parent_pointer()].erase(p.back());
    }
  }
  return doc;
}

}  // namespace metrale::test
