// The per-stream Generation (engine/generation.h) on the demo's byte-level tokenizer, without a
// model: accepting k tokens at once equals one at a time, ends (eos, max_tokens, a full
// context, stop strings spanning tokens), the hold-back window and its release at the end,
// characters split over tokens, rollback, and the pick's logprobs.
#include "engine/generation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace metrale {
namespace {

const Tokenizer& demo() {
  static const Tokenizer t = Tokenizer::from_file("models/demo/tokenizer.json");
  return t;
}

std::vector<int32_t> ids_of(const std::string& text) { return demo().encode(text, false); }

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The two byte-level tokens of U+00E9 (C3 A9), which the demo vocabulary does not merge.
std::vector<int32_t> e_acute_bytes() {
  const auto c3 = demo().token_to_id("\xC3\x83");  // the byte-level alphabet's 0xC3
  const auto a9 = demo().token_to_id("\xC2\xA9");  // 0xA9
  EXPECT_TRUE(c3.has_value() && a9.has_value());
  EXPECT_EQ(demo().decode(std::vector<int32_t>{*c3, *a9}, true), "\xC3\xA9");
  return {*c3, *a9};
}

constexpr int32_t kEos = 0;  // the demo's <|endoftext|>

GenerationParams params(int64_t max_tokens = 1000, std::vector<std::string> stop = {}) {
  return {.eos_ids = {kEos}, .stop = std::move(stop), .max_tokens = max_tokens};
}

// Everything a generation reports, fed one token at a time with a take(kCertain) after each
// (as a streaming server does), then take(kAll).
struct Released {
  std::vector<std::string> chunks;
  std::string text;
  std::vector<int32_t> tokens;
  size_t accepted = 0;
};
Released one_at_a_time(Generation& g, const std::vector<int32_t>& tokens) {
  Released r;
  for (int32_t t : tokens) {
    if (g.ended()) break;
    r.accepted += g.accept(t);
    GenerationDelta d = g.take(Release::kCertain);
    r.tokens.insert(r.tokens.end(), d.tokens.begin(), d.tokens.end());
    if (!d.text.empty()) r.chunks.push_back(d.text);
    r.text += d.text;
  }
  GenerationDelta d = g.take(Release::kAll);
  r.tokens.insert(r.tokens.end(), d.tokens.begin(), d.tokens.end());
  if (!d.text.empty()) r.chunks.push_back(d.text);
  r.text += d.text;
  return r;
}

TEST(Generation, AcceptKTokensStopsAtEosWhichIsNotOutput) {
  const std::vector<int32_t> text = ids_of(" And God said");
  ASSERT_GE(text.size(), 2u);
  Generation g(params(), {5, 6, 7}, &demo());
  const std::vector<int32_t> k = cat(text, {kEos, 42, 43});
  EXPECT_EQ(g.accept(k), text.size() + 1);  // the eos is taken, the tokens after it are not
  ASSERT_TRUE(g.ended());
  EXPECT_EQ(*g.end(), StopReason::kEos);
  EXPECT_EQ(std::vector<int32_t>(g.generated().begin(), g.generated().end()), text);
  EXPECT_EQ(std::vector<int32_t>(g.input().begin(), g.input().end()), cat({5, 6, 7}, text));
  EXPECT_EQ(g.completion_tokens(), static_cast<int64_t>(text.size()) + 1);
  EXPECT_EQ(g.accept(std::vector<int32_t>{1, 2}), 0u) << "an ended generation takes nothing";
  const GenerationDelta d = g.take(Release::kAll);
  EXPECT_EQ(d.tokens, text);
  EXPECT_EQ(d.text, " And God said");

  GenerationParams keep = params();
  keep.ignore_eos = true;
  Generation past(keep, {1}, &demo());
  EXPECT_EQ(past.accept(std::vector<int32_t>{kEos, 5}), 2u);
  EXPECT_FALSE(past.ended());
  EXPECT_EQ(past.generated().size(), 2u);
}

TEST(Generation, AcceptingKAtOnceEqualsOneAtATime) {
  const std::vector<int32_t> text = ids_of(" And the evening and the morning were the third day.");
  for (const auto& stop : std::vector<std::vector<std::string>>{{}, {"morning w"}, {"zz", "day"}}) {
    Generation a(params(1000, stop), {1}, &demo());
    const Released one = one_at_a_time(a, text);
    for (size_t k : {2u, 3u, 7u}) {
      Generation b(params(1000, stop), {1}, &demo());
      size_t taken = 0;
      for (size_t i = 0; i < text.size() && !b.ended(); i += k) {
        const auto n = std::min(k, text.size() - i);
        taken += b.accept(std::span(text).subspan(i, n));
      }
      const GenerationDelta d = b.take(Release::kAll);
      EXPECT_EQ(d.text, one.text) << k;
      EXPECT_EQ(d.tokens, one.tokens) << k;
      EXPECT_EQ(taken, one.accepted) << k;
      EXPECT_EQ(b.end(), a.end()) << k;
    }
  }
}

TEST(Generation, MaxTokensAndAFullContextEndIt) {
  const std::vector<int32_t> t = {100, 101, 102, 103, 104};
  Generation g(params(3), {1, 2}, &demo());
  EXPECT_EQ(g.accept(t), 3u);
  EXPECT_EQ(g.end(), StopReason::kMaxTokens);
  EXPECT_EQ(g.generated().size(), 3u);

  Generation none(params(0), {1, 2}, &demo());
  EXPECT_EQ(none.end(), StopReason::kMaxTokens) << "max_tokens 0 ends before any token";
  EXPECT_EQ(none.accept(t), 0u);

  GenerationParams p = params();
  p.max_input = 4;  // the context holds 2: two tokens fill it
  Generation full(p, {1, 2}, &demo());
  EXPECT_EQ(full.accept(t), 2u);
  EXPECT_EQ(full.end(), StopReason::kContextFull);
  // Both at the same token: max_tokens wins (as Session always reported it).
  p.max_tokens = 2;
  Generation both(p, {1, 2}, &demo());
  EXPECT_EQ(both.accept(t), 2u);
  EXPECT_EQ(both.end(), StopReason::kMaxTokens);
  // An eos that would fill the context is an eos.
  Generation eos(p, {1, 2}, &demo());
  EXPECT_EQ(eos.accept(std::vector<int32_t>{100, kEos}), 2u);
  EXPECT_EQ(eos.end(), StopReason::kEos);
}

TEST(Generation, StopStringsSpanningTokensCutTheText) {
  const std::string whole = " And God said, Let there be light: and there was light.";
  const std::vector<int32_t> text = ids_of(whole);
  // "Let there" spans several tokens; the stop string is found when its last piece arrives.
  Generation g(params(1000, {"never", "Let there"}), {1}, &demo());
  const Released r = one_at_a_time(g, text);
  EXPECT_EQ(g.end(), StopReason::kStopString);
  EXPECT_EQ(r.text, " And God said, ");
  EXPECT_EQ(g.text(), " And God said, ");
  // Nothing of the stop string was ever released, and the tokens up to the one completing it
  // are the output.
  for (const std::string& c : r.chunks) EXPECT_EQ(c.find('L'), std::string::npos) << c;
  EXPECT_LT(r.accepted, text.size());
  EXPECT_EQ(r.tokens,
            std::vector<int32_t>(text.begin(), text.begin() + static_cast<ptrdiff_t>(r.accepted)));
  EXPECT_EQ(demo().decode(r.tokens, true).find("Let there"), 15u);

  // Completed by the same token, the first stop string in the list wins.
  Generation first(params(1000, {"be light", "there be light"}), {1}, &demo());
  one_at_a_time(first, text);
  EXPECT_EQ(first.text(), " And God said, Let there ");
  Generation second(params(1000, {"there be light", "be light"}), {1}, &demo());
  one_at_a_time(second, text);
  EXPECT_EQ(second.text(), " And God said, Let ");
  // Empty stop strings never match.
  Generation empty(params(1000, {""}), {1}, &demo());
  EXPECT_EQ(one_at_a_time(empty, text).text, whole);
}

TEST(Generation, HeldBackTextIsReleasedAtTheEnd) {
  const std::string whole = " In the beginning God created the heaven";
  const std::vector<int32_t> text = ids_of(whole);
  // A stop string that never occurs still holds back its length - 1 bytes while generating.
  Generation g(params(1000, {"xyzw"}), {1}, &demo());
  std::string released;
  for (int32_t t : text) {
    g.accept(t);
    released += g.take(Release::kCertain).text;
    EXPECT_EQ(released, g.text().substr(0, g.text().size() > 3 ? g.text().size() - 3 : 0));
  }
  EXPECT_FALSE(g.ended());
  const GenerationDelta end = g.take(Release::kAll);
  EXPECT_EQ(end.text, whole.substr(whole.size() - 3));
  EXPECT_EQ(released + end.text, whole);
  EXPECT_TRUE(g.take(Release::kAll).text.empty()) << "released once";

  // kNone (a cancelled stream): the tokens, not the held-back text.
  Generation c(params(1000, {"xyzw"}), {1}, &demo());
  c.accept(text);
  const GenerationDelta gone = c.take(Release::kNone);
  EXPECT_EQ(gone.tokens, text);
  EXPECT_TRUE(gone.text.empty());
}

TEST(Generation, ACharacterSplitOverTokensComesOutWhole) {
  const std::vector<int32_t> e = e_acute_bytes();
  const std::vector<int32_t> caf = ids_of(" caf");
  Generation g(params(), {1}, &demo());
  g.accept(caf);
  EXPECT_EQ(g.take(Release::kCertain).text, " caf");
  g.accept(e[0]);
  EXPECT_EQ(g.text(), " caf") << "half a character is not text yet";
  GenerationDelta half = g.take(Release::kCertain);
  EXPECT_TRUE(half.text.empty());
  EXPECT_EQ(half.tokens, std::vector<int32_t>{e[0]}) << "its token is reported all the same";
  g.accept(e[1]);
  EXPECT_EQ(g.text(), " caf\xC3\xA9");
  EXPECT_EQ(g.take(Release::kCertain).text, "\xC3\xA9");
  g.accept(ids_of(" ok"));
  EXPECT_EQ(g.take(Release::kAll).text, " ok");

  // The hold-back never cuts a character: with one byte held, "é" waits whole.
  Generation h(params(1000, {"zz"}), {1}, &demo());
  h.accept(cat(caf, e));
  EXPECT_EQ(h.take(Release::kCertain).text, " caf");
  EXPECT_EQ(h.take(Release::kAll).text, "\xC3\xA9");

  // Ending inside a character: the server leaves it out (vLLM), Session's text shows U+FFFD
  // (the tokenizer's decode of the tokens).
  for (const bool show : {false, true}) {
    GenerationParams p = params();
    p.end_shows_partial_char = show;
    Generation cut(p, {1}, &demo());
    cut.accept(cat(caf, {e[0]}));
    const std::string rest = one_at_a_time(cut, {}).text;
    EXPECT_EQ(rest, show ? " caf\xEF\xBF\xBD" : " caf") << show;
    if (show) {
      EXPECT_EQ(cut.text(), demo().decode(cat(caf, {e[0]}), true));
    }
  }
}

TEST(Generation, IncrementalTextEqualsTheWholeDecode) {
  const std::vector<int32_t> e = e_acute_bytes();
  std::vector<int32_t> text = ids_of(
      " And God called the light Day, and the darkness he called Night. And the evening and the "
      "morning were the first day.");
  text.insert(text.begin() + 5, e.begin(), e.end());
  text.insert(text.begin() + 20, e.begin(), e.end());
  text.insert(text.begin() + 30, kEos);  // a special token
  GenerationParams p = params();
  p.ignore_eos = true;
  Generation g(p, {1}, &demo());
  const Released r = one_at_a_time(g, text);
  EXPECT_EQ(r.text, demo().decode(text, /*skip_special_tokens=*/true));
  EXPECT_EQ(r.tokens, text);
  p.skip_special_tokens = false;
  Generation keep(p, {1}, &demo());
  EXPECT_EQ(one_at_a_time(keep, text).text, demo().decode(text, false));
  // A skipped special token between a character's bytes.
  const std::vector<int32_t> split = cat(ids_of(" caf"), {e[0], kEos, e[1]});
  p.skip_special_tokens = true;
  Generation inside(p, {1}, &demo());
  EXPECT_EQ(one_at_a_time(inside, split).text, " caf\xC3\xA9");
  Generation none(p, {1}, nullptr);
  EXPECT_EQ(none.accept(text), text.size());
  EXPECT_TRUE(none.take(Release::kAll).text.empty()) << "no tokenizer, no text";
}

TEST(Generation, RollbackUndoesTheLastTokens) {
  const std::vector<int32_t> first = ids_of(" And God said");
  const std::vector<int32_t> wrong = ids_of(", Let there be darkness");
  const std::vector<int32_t> right = ids_of(", Let there be light");
  Generation g(params(1000, {"be light"}), {1}, &demo());
  g.accept(first);
  const GenerationDelta reported = g.take(Release::kCertain);
  g.accept(wrong);
  EXPECT_EQ(g.can_roll_back(), wrong.size());
  g.rollback(wrong.size());
  EXPECT_EQ(g.text(), " And God said");
  EXPECT_EQ(std::vector<int32_t>(g.generated().begin(), g.generated().end()), first);
  EXPECT_EQ(g.completion_tokens(), static_cast<int64_t>(first.size()));
  // Continuing after the rollback is as if the rolled-back tokens never came.
  g.accept(right);
  EXPECT_EQ(g.end(), StopReason::kStopString);
  EXPECT_EQ(g.text(), " And God said, Let there ");
  // A rollback of the token that ended it (the stop string cut the text) restores the text.
  g.rollback(1);
  EXPECT_FALSE(g.ended());
  EXPECT_EQ(g.text(),
            demo().decode(cat(first, std::vector<int32_t>(right.begin(), right.end() - 1)), true));
  g.accept(right.back());
  EXPECT_EQ(g.end(), StopReason::kStopString);
  const GenerationDelta rest = g.take(Release::kAll);
  EXPECT_EQ(reported.text + rest.text, " And God said, Let there ");
  EXPECT_EQ(cat(reported.tokens, rest.tokens), cat(first, right));
  // What was reported cannot be taken back.
  EXPECT_EQ(g.can_roll_back(), 0u);
  EXPECT_THROW(g.rollback(1), Error);

  // An eos rolled back: the generation goes on.
  Generation e(params(), {1}, &demo());
  e.accept(cat(first, {kEos}));
  e.rollback(1);
  EXPECT_FALSE(e.ended());
  EXPECT_EQ(e.completion_tokens(), static_cast<int64_t>(first.size()));
  e.accept(right);
  EXPECT_EQ(e.take(Release::kAll).text, demo().decode(cat(first, right), true));

  // Half a character rolled back, then the other character's bytes.
  const std::vector<int32_t> ch = e_acute_bytes();
  Generation u(params(), {1}, &demo());
  u.accept(cat(first, {ch[0], ch[1]}));
  u.rollback(2);
  EXPECT_EQ(u.text(), " And God said");
  u.accept(ids_of("!"));
  EXPECT_EQ(u.take(Release::kAll).text, " And God said!");
}

TEST(Generation, PicksAreGreedyOrSeededAndLogprobsAreTheRowsOwn) {
  const std::vector<float> row = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f};
  PickScratch scratch(5);
  GenerationParams p = params();
  p.top_logprobs = 2;
  p.logit_bias = {{3, 1.0f}};  // 1.5 + 1 beats 2.0; logprobs stay the model's
  Generation g(p, {1}, nullptr);
  std::vector<float> r = row;
  const int32_t t = g.pick(r, scratch);
  EXPECT_EQ(t, 3);
  g.accept(t);
  const GenerationDelta d = g.take(Release::kCertain);
  ASSERT_EQ(d.logprobs.size(), 1u);
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x));
  EXPECT_NEAR(d.logprobs[0].logprob, 1.5 - std::log(sum), 1e-5);
  ASSERT_EQ(d.logprobs[0].top.size(), 2u);
  EXPECT_EQ(d.logprobs[0].top[0].first, 1);
  EXPECT_EQ(d.logprobs[0].top[1].first, 3);
  // k picks pair with k accepted tokens in order; an eos takes no logprobs.
  std::vector<float> r1 = row, r2 = row;
  GenerationParams q = p;
  q.logit_bias.clear();
  q.eos_ids = {1};
  Generation k(q, {1}, nullptr);
  const std::vector<int32_t> two = {k.pick(r1, scratch), k.pick(r2, scratch)};
  EXPECT_EQ(two, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(k.accept(two), 1u);
  EXPECT_EQ(k.end(), StopReason::kEos);
  EXPECT_TRUE(k.take(Release::kAll).logprobs.empty());
  // With logprobs wanted, a token that was not picked is a programmer error.
  Generation bad(p, {1}, nullptr);
  EXPECT_THROW(bad.accept(4), Error);

  // Sampling: the seed decides, per generation.
  GenerationParams s = params();
  s.sampling = {.temperature = 1.0f};
  s.seed = 7;
  std::vector<int32_t> a, b;
  Generation ga(s, {1}, nullptr), gb(s, {1}, nullptr);
  for (int i = 0; i < 32; ++i) {
    std::vector<float> x = row, y = row;
    a.push_back(ga.pick(x, scratch));
    b.push_back(gb.pick(y, scratch));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(std::count(a.begin(), a.end(), a[0]), 32) << "temperature 1 should vary";
}

TEST(Generation, PenaltiesCountTheGeneratedTokens) {
  PickScratch scratch(4);
  GenerationParams p = params();
  p.eos_ids.clear();
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 1.0f;
  Generation g(p, {0, 0, 0}, nullptr);  // the context does not count
  std::vector<float> row = {3.0f, 2.0f, 0.0f, 0.0f};
  EXPECT_EQ(g.pick(row, scratch), 0);
  g.accept(std::vector<int32_t>{0, 0});
  row = {3.0f, 2.0f, 0.0f, 0.0f};
  EXPECT_EQ(g.pick(row, scratch), 1);  // 3 - 0.5 - 2 * 1 = 0.5 < 2
  EXPECT_FLOAT_EQ(row[0], 0.5f);
}

}  // namespace
}  // namespace metrale
