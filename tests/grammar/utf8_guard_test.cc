// The UTF-8 guard alone: its step function against the tokenizer's strict decoder (Python's
// rules) on random byte strings, and its masks over a small vocabulary of byte tokens.
#include "grammar/utf8_guard.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "io/tokenizer/utf8.h"

namespace metrale {
namespace {

bool allowed(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
}

TEST(Utf8Guard, StepAgreesWithTheStrictDecoder) {
  // Bytes drawn mostly from the edges of RFC 3629's table, where the invalid forms live.
  const std::vector<uint8_t> edges = {0x00, 0x3C, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF,
                                      0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE,
                                      0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF7, 0xF8, 0xFF};
  std::mt19937 rng(11);
  int valid = 0;
  for (int n = 0; n < 200000; ++n) {
    std::string s(1 + rng() % 6, '\0');
    for (char& c : s)
      c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : edges[rng() % edges.size()]);
    // Whole and valid: the step ends between characters. A valid prefix of a character ends
    // inside one, owing the bytes that complete it.
    const std::optional<Utf8State> st = utf8_step({}, s);
    const size_t good = tok::utf8_valid_prefix(s);
    if (good == s.size()) {
      ASSERT_TRUE(st.has_value()) << testing::PrintToString(s);
      EXPECT_EQ(st->need, 0) << testing::PrintToString(s);
      ++valid;
      continue;
    }
    // Invalid as a whole: the step refuses it, unless the tail after the valid prefix is the
    // start of a character that more bytes would complete.
    if (st.has_value()) {
      ASSERT_GT(st->need, 0) << testing::PrintToString(s);
      std::string whole = s;
      for (uint8_t k = 0; k < st->need; ++k) whole.push_back(static_cast<char>(k ? 0x80 : st->lo));
      EXPECT_EQ(tok::utf8_valid_prefix(whole), whole.size()) << testing::PrintToString(s);
    }
  }
  EXPECT_GT(valid, 1000);
  // The forms xgrammar 0.2.9 lets through: overlong, surrogate, past U+10FFFF.
  for (const char* bad : {"\xC0\xBC", "\xC1\x81", "\xE0\x80\x80", "\xE0\x9F\xBF", "\xED\xA0\x80",
                          "\xF0\x80\x80\x80", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80"})
    EXPECT_FALSE(utf8_step({}, bad).has_value()) << testing::PrintToString(std::string(bad));
  for (const char* good :
       {"<", "\xC2\x80", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF"})
    EXPECT_EQ(utf8_step({}, good), Utf8State{}) << testing::PrintToString(std::string(good));
}

TEST(Utf8Guard, MasksByWhereTheOutputStands) {
  // Tokens 0..255: one byte each; 256: "\xE4\xBD" (part of a character); 257: "" (a special
  // token); 258: "a\xE0"; ids 259..299 have no bytes (the logits' padding).
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.emplace_back("\xE4\xBD");
  bytes.emplace_back("");
  bytes.emplace_back("a\xE0");
  const Utf8Guard g(bytes, 300);
  std::vector<uint32_t> all(10, ~0u), mask;

  mask = all;
  g.restrict({}, mask);
  for (int b = 0; b < 256; ++b) {
    const bool lead_or_ascii = b < 0x80 || (b >= 0xC2 && b <= 0xF4);
    EXPECT_EQ(allowed(mask, b), lead_or_ascii) << b;
  }
  EXPECT_TRUE(allowed(mask, 256));
  EXPECT_TRUE(allowed(mask, 257));
  EXPECT_TRUE(allowed(mask, 258));
  EXPECT_TRUE(allowed(mask, 299));

  // After E0 only A0..BF continue (no overlong form); a special token must wait.
  const Utf8State e0 = *g.after({}, 0xE0);
  mask = all;
  g.restrict(e0, mask);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(allowed(mask, b), b >= 0xA0 && b <= 0xBF) << b;
  EXPECT_FALSE(allowed(mask, 256));
  EXPECT_FALSE(allowed(mask, 257));
  EXPECT_FALSE(allowed(mask, 258));
  EXPECT_FALSE(g.after(e0, 257).has_value());
  EXPECT_EQ(g.after(*g.after({}, 258), 0xA0), (Utf8State{1, 0x80, 0xBF}));

  // After ED: 80..9F (no surrogate); after E4 BD one more byte 80..BF ends the character.
  const Utf8State ed = *g.after({}, 0xED);
  mask = all;
  g.restrict(ed, mask);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(allowed(mask, b), b >= 0x80 && b <= 0x9F) << b;
  EXPECT_EQ(g.after(*g.after({}, 256), 0xA0), Utf8State{});
  EXPECT_FALSE(g.after({}, 300).has_value());
  EXPECT_FALSE(g.after({}, -1).has_value());
}

}  // namespace
}  // namespace metrale
