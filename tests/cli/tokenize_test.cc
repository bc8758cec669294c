// `metrale tokenize`, run as the built binary: ids of a text (comma-separated, the form
// `generate --ids` takes), --decode back to the text, --json, and bad ids refused.
#include <gtest/gtest.h>

#include <string>

#include "cli_run.h"

namespace metrale {
namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

TEST(TokenizeCli, IdsAndBack) {
  const CliRun ids = run_metrale("tokenize", {"--model", "models/demo", "And God said"}, false);
  ASSERT_EQ(ids.status, 0) << ids.out;
  // The demo tokenizer adds no special tokens; "And", " God", " said" are single tokens.
  EXPECT_EQ(trimmed(ids.out), "297,388,389");
  const CliRun text =
      run_metrale("tokenize", {"--model", "models/demo", "--decode", trimmed(ids.out)}, false);
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_EQ(trimmed(text.out), "And God said");
}

TEST(TokenizeCli, Json) {
  const CliRun ids =
      run_metrale("tokenize", {"--model", "models/demo", "--json", "And God said"}, false);
  ASSERT_EQ(ids.status, 0) << ids.out;
  EXPECT_EQ(trimmed(ids.out), R"({"ids":[297,388,389]})");
  const CliRun text =
      run_metrale("tokenize", {"--model", "models/demo", "--json", "-d", "297,388,389"}, false);
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_EQ(trimmed(text.out), R"({"text":"And God said"})");
}

TEST(TokenizeCli, BadIdsAreRefused) {
  const CliRun word = run_metrale("tokenize", {"--model", "models/demo", "--decode", "1,x"});
  EXPECT_EQ(word.status, 1);
  EXPECT_NE(word.out.find("item 2 'x' is not an integer"), std::string::npos) << word.out;
  const CliRun negative = run_metrale("tokenize", {"--model", "models/demo", "--decode", "-3"});
  EXPECT_EQ(negative.status, 1);
  const CliRun unknown = run_metrale("tokenize", {"--model", "models/demo", "--decode", "99999"});
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.out.find("99999 is not in the vocabulary"), std::string::npos) << unknown.out;
  const CliRun no_dir = run_metrale("tokenize", {"--model", "/nonexistent", "x"});
  EXPECT_EQ(no_dir.status, 1);
  EXPECT_NE(no_dir.out.find("no tokenizer.json"), std::string::npos) << no_dir.out;
}

}  // namespace
}  // namespace metrale
