// grammar::pattern_without: a pattern narrowed so that no match holds one character — what it
// writes for each construct, what it refuses (naming the offset), and, over random strings,
// that the narrowed pattern matches only strings without the character that the pattern
// matches too (std::regex's ECMAScript grammar as the judge).
#include "grammar/pattern.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>

#include "core/error.h"

namespace metrale::grammar {
namespace {

std::string narrow(const std::string& p) { return pattern_without(p, '<', "test"); }

TEST(PatternWithout, RewritesWhatCouldMatchTheCharacter) {
  EXPECT_EQ(narrow("^.{1,40}$"), "^[^<\\n\\r]{1,40}$");
  EXPECT_EQ(narrow("[^a-z]+"), "[^<a-z]+");
  EXPECT_EQ(narrow("[ -~]"), "[ -\\u003b\\u003d-~]");
  EXPECT_EQ(narrow("[<a]"), "[a]");
  EXPECT_EQ(narrow("[\\<b-c]"), "[b-c]");
  EXPECT_EQ(narrow("[;-<]"), "[;-\\u003b]");
  EXPECT_EQ(narrow("[<-?]"), "[\\u003d-?]");
  EXPECT_EQ(narrow("\\S+\\W\\D"), "[^\\s<]+[^\\w<][^\\d<]");
  EXPECT_EQ(narrow("\\d\\w\\s\\.\\x41\\u00e9[\\d_]"), "\\d\\w\\s\\.\\x41\\u00e9[\\d_]");
  EXPECT_EQ(narrow("(a|b)*c{2}é"), "(a|b)*c{2}é");
}

TEST(PatternWithout, RefusesWhatCannotDoWithoutIt) {
  for (const char* p : {"<a>", "a\\<", "\\x3c", "\\u003C", "[<]", "[\\x3C]", "[\\S]", "[a\\W]"}) {
    try {
      narrow(p);
      ADD_FAILURE() << p << " was narrowed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("test: the pattern"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("at offset"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(narrow("[a-"), Error);
  EXPECT_THROW(narrow("a\\"), Error);
}

TEST(PatternWithout, MatchesOnlyWhatThePatternMatchesAndNeverTheCharacter) {
  const char* patterns[] = {"^.{0,6}$",   "^[ -~]{1,5}$", "^[^ab]*$", "^\\S+$",
                            "^(\\W|x)+$", "^[;-?]+$",     "^\\D*$",   "^[^\\d]{2,}$"};
  const std::string alphabet = "ab<>;=?x 1\n";
  std::mt19937 rng(5);
  for (const char* p : patterns) {
    const std::regex original(p), narrowed(narrow(p));
    int matched = 0;
    for (int n = 0; n < 3000; ++n) {
      std::string s(static_cast<size_t>(rng() % 7), ' ');
      for (char& ch : s) ch = alphabet[rng() % alphabet.size()];
      if (!std::regex_match(s, narrowed)) continue;
      ++matched;
      EXPECT_EQ(s.find('<'), std::string::npos) << p << " matched \"" << s << "\"";
      EXPECT_TRUE(std::regex_match(s, original)) << p << " does not match \"" << s << "\"";
    }
    EXPECT_GT(matched, 0) << p;
  }
}

}  // namespace
}  // namespace metrale::grammar
