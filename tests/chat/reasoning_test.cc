// The <think> splitter: where reasoning is, the whitespace around it, and that any split of
// a reply into feed() calls gives what one parse of the whole gives.
#include "chat/reasoning.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace metrale::chat {
namespace {

struct Case {
  bool starts_open;
  std::string text;
  std::string reasoning;
  std::string content;
};

const std::vector<Case> kCases = {
    // Qwen3: the reply opens the block itself.
    {false, "<think>\nThe user greets.\n</think>\n\nHello!", "The user greets.", "Hello!"},
    {false, "\n<think>\n\n</think>\n\nHi", "", "Hi"},    // an empty block (thinking disabled)
    {false, "<think>a\n\nb\n</think>c", "a\n\nb", "c"},  // inner newlines kept
    // Qwen3.5 / DeepSeek-V3.1: the prompt opened it.
    {true, "Let me check.\n</think>\n\n<tool_call>x</tool_call>", "Let me check.",
     "<tool_call>x</tool_call>"},
    {true, "still thinking when max_tokens hit\n", "still thinking when max_tokens hit", ""},
    // No block: content, verbatim.
    {false, "  plain reply </think> kept", "", "  plain reply </think> kept"},
    {false, "<thin", "", "<thin"},
    {false, "   ", "", "   "},
    {false, "", "", ""},
    {false, "<think> unterminated", " unterminated", ""},
    {false, "x<think>y</think>", "", "x<think>y</think>"},                 // not at the start
    {false, "<think>1</think><think>2</think>", "1", "<think>2</think>"},  // only the first
    {true, "</think>", "", ""},
    {true, "αβ</think>γ", "αβ", "γ"},
};

ReasoningDelta feed_in_pieces(const Case& c, const std::vector<size_t>& cuts) {
  ReasoningParser p(ReasoningFormat::kThink, c.starts_open);
  ReasoningDelta all;
  size_t at = 0;
  for (size_t cut : cuts) {
    const ReasoningDelta d = p.feed(std::string_view(c.text).substr(at, cut - at));
    all.reasoning += d.reasoning;
    all.content += d.content;
    at = cut;
  }
  const ReasoningDelta d = p.feed(std::string_view(c.text).substr(at));
  all.reasoning += d.reasoning;
  all.content += d.content;
  const ReasoningDelta last = p.finish();
  all.reasoning += last.reasoning;
  all.content += last.content;
  return all;
}

TEST(Reasoning, WholeReplies) {
  for (const Case& c : kCases) {
    const ReasoningDelta d = ReasoningParser::parse(ReasoningFormat::kThink, c.starts_open, c.text);
    EXPECT_EQ(d.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(d.content, c.content) << c.text;
  }
}

TEST(Reasoning, AnySplitGivesTheWholeParse) {
  for (const Case& c : kCases) {
    for (size_t i = 0; i <= c.text.size(); ++i) {
      for (size_t j = i; j <= c.text.size(); ++j) {
        const ReasoningDelta d = feed_in_pieces(c, {i, j});
        ASSERT_EQ(d.reasoning, c.reasoning) << c.text << " cut at " << i << ", " << j;
        ASSERT_EQ(d.content, c.content) << c.text << " cut at " << i << ", " << j;
      }
    }
    std::vector<size_t> bytes;
    for (size_t i = 1; i < c.text.size(); ++i) bytes.push_back(i);
    const ReasoningDelta d = feed_in_pieces(c, bytes);
    EXPECT_EQ(d.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(d.content, c.content) << c.text;
  }
}

TEST(Reasoning, TextFlowsAsSoonAsItIsDecided) {
  ReasoningParser p(ReasoningFormat::kThink, /*starts_open=*/true);
  EXPECT_EQ(p.feed("Let me </th").reasoning, "Let me ");  // "</th" waits
  const ReasoningDelta d = p.feed("ink>\n\nSure");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Sure");
  EXPECT_EQ(p.feed(" thing").content, " thing");

  ReasoningParser q(ReasoningFormat::kThink, /*starts_open=*/false);
  EXPECT_EQ(q.feed("Hello").content, "Hello");  // cannot be <think>: content at once
}

TEST(Reasoning, NoneIsAllContent) {
  const ReasoningDelta d =
      ReasoningParser::parse(ReasoningFormat::kNone, true, "<think>x</think>\n y");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "<think>x</think>\n y");
}

TEST(Reasoning, FormatsAndPrompts) {
  EXPECT_EQ(reasoning_format_from_name("think"), ReasoningFormat::kThink);
  EXPECT_EQ(reasoning_format_name(ReasoningFormat::kNone), "none");
  EXPECT_THROW(reasoning_format_from_name("deepseek"), Error);
  EXPECT_EQ(detect_reasoning_format("{{ '<think>' }}...{{ '</think>' }}"), ReasoningFormat::kThink);
  EXPECT_EQ(detect_reasoning_format("{{ messages }}"), ReasoningFormat::kNone);
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace metrale::chat
