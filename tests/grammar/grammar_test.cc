// The grammar matcher over real vocabularies: the demo model's byte-level BPE (tiny), the real
// Qwen3 tokenizer (151k tokens, special tokens and an eos) and a SentencePiece byte-fallback
// one; masks, accept, rollback, the eos only at an accept state, and errors naming the field.
#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generation.h"
#include "io/tokenizer/gzip_file.h"
#include "io/tokenizer/tokenizer.h"
#include "io/tokenizer/utf8.h"

namespace metrale {
namespace {

#define SKIP_WITHOUT_XGRAMMAR()                                                             \
  if (!grammar_available())                                                                 \
  GTEST_SKIP() << "built without xgrammar (scripts/fetch-xgrammar.sh could not fetch it): " \
                  "structured outputs are off"

const Tokenizer& demo() {
  static const Tokenizer t = Tokenizer::from_file("models/demo/tokenizer.json");
  return t;
}
const Tokenizer& qwen3() {
  static const Tokenizer t = [] {
    Tokenizer tok = Tokenizer::from_json(
        testing::read_gzip_file("tests/data/tokenizers/qwen3/tokenizer.json.gz"),
        "qwen3 tokenizer.json");
    return tok;
  }();
  return t;
}

bool allowed(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
}

std::vector<int32_t> allowed_ids(const std::vector<uint32_t>& mask, int64_t vocab) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < vocab; ++i)
    if (allowed(mask, i)) out.push_back(i);
  return out;
}

GrammarSpec schema(std::string text) {
  return {.kind = GrammarSpec::Kind::kJsonSchema, .text = std::move(text), .field = "guided_json"};
}

// Walks `grammar` by picking uniformly among the allowed tokens until the eos is the pick or
// `steps` run out; returns the ids (without the eos) and whether it ended on the eos.
std::pair<std::vector<int32_t>, bool> random_walk(std::shared_ptr<const CompiledGrammar> grammar,
                                                  int32_t eos, uint32_t seed, int steps) {
  GrammarMatcher m(std::move(grammar));
  std::vector<uint32_t> mask(m.mask_words());
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int s = 0; s < steps; ++s) {
    m.fill_mask(mask);
    std::vector<int32_t> ok = allowed_ids(mask, m.vocab_size());
    EXPECT_FALSE(ok.empty()) << "step " << s << " after ids " << ::testing::PrintToString(ids);
    if (ok.empty()) break;
    // Prefer ending once the output is whole, so the walk stays short.
    int32_t pick = (m.completed() && allowed(mask, eos) && rng() % 2 == 0)
                       ? eos
                       : ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
    EXPECT_EQ(allowed(mask, eos), m.completed()) << "the eos is allowed only at an accept state";
    EXPECT_TRUE(m.accept(pick));
    if (pick == eos) {
      EXPECT_TRUE(m.terminated());
      return {ids, true};
    }
    ids.push_back(pick);
  }
  return {ids, false};
}

TEST(Grammar, ChoiceOverTheDemoTokenizer) {
  SKIP_WITHOUT_XGRAMMAR();
  const Tokenizer& tok = demo();
  const int32_t eos = *tok.eos_id();
  GrammarCompiler c(tok, static_cast<int64_t>(tok.id_limit()), {eos});
  auto g = c.compile({.kind = GrammarSpec::Kind::kChoice, .choices = {"LORD", "Moses", "a \"q\""}});
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto [ids, ended] = random_walk(g, eos, seed, 64);
    ASSERT_TRUE(ended);
    const std::string text = tok.decode(ids, false);
    EXPECT_TRUE(text == "LORD" || text == "Moses" || text == "a \"q\"") << text;
  }
  // The same text compiles once.
  EXPECT_EQ(
      c.compile({.kind = GrammarSpec::Kind::kChoice, .choices = {"LORD", "Moses", "a \"q\""}}), g);
  EXPECT_EQ(c.cached(), 1u);
}

TEST(Grammar, SchemaWalksParseAndValidateOverQwen3) {
  SKIP_WITHOUT_XGRAMMAR();
  const Tokenizer& tok = qwen3();
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  // The model's logits are wider than the tokenizer (padding rows): those ids are never allowed.
  const int64_t V = static_cast<int64_t>(tok.id_limit()) + 64;
  GrammarCompiler c(tok, V, {eos});
  auto g = c.compile(schema(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":6},
      "n":{"type":"integer","minimum":-5,"maximum":5},
      "tags":{"type":"array","items":{"enum":["x","y"]},"minItems":1,"maxItems":2}},
      "required":["name","n","tags"]})"));
  const std::vector<int32_t> specials = {*tok.token_to_id("<|im_start|>"),
                                         *tok.token_to_id("<|endoftext|>")};
  int whole = 0;
  for (uint32_t seed = 0; seed < 6; ++seed) {
    auto [ids, ended] = random_walk(g, eos, seed, 200);
    for (int32_t id : ids) {
      EXPECT_LT(id, static_cast<int32_t>(tok.id_limit()));
      EXPECT_TRUE(std::find(specials.begin(), specials.end(), id) == specials.end());
    }
    if (!ended) continue;
    ++whole;
    const nlohmann::json j = nlohmann::json::parse(tok.decode(ids, false));
    ASSERT_TRUE(j.is_object());
    EXPECT_LE(j["name"].get<std::string>().size(), 6u * 4);  // 6 characters of UTF-8
    EXPECT_GE(j["n"].get<int>(), -5);
    EXPECT_LE(j["n"].get<int>(), 5);
    EXPECT_GE(j["tags"].size(), 1u);
    EXPECT_LE(j["tags"].size(), 2u);
    EXPECT_EQ(j.size(), 3u);
  }
  EXPECT_GT(whole, 0);
}

// The bytes Qwen3's byte-level tokens spell (GPT-2's byte map undone).
std::string qwen3_bytes(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) {
    const std::string t = *qwen3().id_to_token(id);
    for (size_t i = 0; i < t.size();) {
      char32_t c = 0;
      i += tok::utf8_decode(t, i, &c);
      out.push_back(static_cast<char>(tok::char_to_byte(c)));
    }
  }
  return out;
}

size_t codepoints(const std::string& utf8) {
  return static_cast<size_t>(std::count_if(utf8.begin(), utf8.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

TEST(Grammar, ConstrainedTextIsValidUtf8OverByteTokens) {
  // xgrammar 0.2.9 matches a character class by the lead byte's length alone, so over byte
  // tokens it let "[^<]{0,3}" spell overlong forms and surrogates (C0 BC, E0 80 80, ED A0 80),
  // which decode to one U+FFFD a byte: more characters than the grammar allows (a glm45 forced
  // call's "maxLength": 3 string came back 5 long). The guard keeps every output valid UTF-8.
  SKIP_WITHOUT_XGRAMMAR();
  const Tokenizer& tok = qwen3();
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  GrammarCompiler c(tok, static_cast<int64_t>(tok.id_limit()), {eos});
  std::vector<int32_t> byte_token(256);
  for (int b = 0; b < 256; ++b) byte_token[b] = *tok.token_to_id(tok::byte_to_utf8()[b]);

  for (const GrammarSpec& spec :
       {GrammarSpec{.kind = GrammarSpec::Kind::kRegex, .text = "[^<]{0,3}"},
        schema(R"({"type":"string","maxLength":3})")}) {
    SCOPED_TRACE(spec.text);
    auto g = c.compile(spec);
    GrammarMatcher m(g);
    std::vector<uint32_t> first(m.mask_words()), mask(m.mask_words());
    const size_t quote = spec.kind == GrammarSpec::Kind::kJsonSchema ? 1 : 0;
    if (quote) {
      ASSERT_TRUE(m.accept(*tok.token_to_id("\"")));
    }
    m.fill_mask(first);
    for (int b = 0x80; b < 0x100; ++b) {
      const bool lead = b >= 0xC2 && b <= 0xF4;
      EXPECT_EQ(allowed(first, byte_token[b]), lead) << "byte " << b << " first";
    }
    // Inside E0 / ED only the bytes that keep the character valid.
    for (const auto& [lead, lo, hi] :
         {std::tuple{0xE0, 0xA0, 0xBF}, std::tuple{0xED, 0x80, 0x9F}}) {
      ASSERT_TRUE(m.accept(byte_token[lead]));
      m.fill_mask(mask);
      for (int b = 0; b < 0x100; ++b) {
        EXPECT_EQ(allowed(mask, byte_token[b]), b >= lo && b <= hi) << lead << " then " << b;
      }
      EXPECT_FALSE(m.accept(byte_token[lo - 1]));  // refused, the state unchanged
      EXPECT_FALSE(allowed(mask, eos));
      m.rollback(1);
      m.fill_mask(mask);
      EXPECT_EQ(mask, first);
    }

    // Random walks, half their picks among the 128 high bytes: every output is valid UTF-8 of
    // at most 3 characters.
    std::mt19937 rng(5);
    int ended = 0;
    for (int walk = 0; walk < 300; ++walk) {
      GrammarMatcher w(g);
      std::vector<int32_t> ids;
      if (quote) {
        ids.push_back(*tok.token_to_id("\""));
        ASSERT_TRUE(w.accept(ids.back()));
      }
      for (int step = 0; step < 16; ++step) {
        w.fill_mask(mask);
        std::vector<int32_t> ok;
        if (rng() % 2 == 0) {
          for (int b = 0x80; b < 0x100; ++b)
            if (allowed(mask, byte_token[b])) ok.push_back(byte_token[b]);
        }
        if (ok.empty()) ok = allowed_ids(mask, w.vocab_size());
        ASSERT_FALSE(ok.empty()) << ::testing::PrintToString(ids);
        const int32_t pick = w.completed() && allowed(mask, eos) && rng() % 3 == 0
                                 ? eos
                                 : ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
        ASSERT_TRUE(w.accept(pick));
        if (pick == eos) break;
        ids.push_back(pick);
      }
      if (!w.terminated()) continue;
      ++ended;
      std::string text = qwen3_bytes(ids);
      if (quote) {
        ASSERT_TRUE(text.size() >= 2 && text.front() == '"' && text.back() == '"') << text;
        text = text.substr(1, text.size() - 2);
      }
      ASSERT_EQ(tok::utf8_valid_prefix(text), text.size()) << ::testing::PrintToString(text);
      EXPECT_LE(codepoints(text), 3u) << text;
    }
    EXPECT_GT(ended, 100);
  }
}

TEST(Grammar, MaskRollbackAndTokensOfTheText) {
  SKIP_WITHOUT_XGRAMMAR();
  const Tokenizer& tok = qwen3();
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  GrammarCompiler c(tok, static_cast<int64_t>(tok.id_limit()), {eos});
  auto g = c.compile({.kind = GrammarSpec::Kind::kRegex, .text = "[0-9]{3}-[a-z]{2}"});
  GrammarMatcher m(g);
  std::vector<uint32_t> first(m.mask_words()), mask(m.mask_words());
  m.fill_mask(first);
  EXPECT_TRUE(allowed(first, *tok.token_to_id("1")));
  EXPECT_FALSE(allowed(first, *tok.token_to_id("a")));
  EXPECT_FALSE(allowed(first, eos));
  const std::vector<int32_t> ids = tok.encode("123-ab", false);
  for (int32_t id : ids) ASSERT_TRUE(m.accept(id));
  EXPECT_TRUE(m.completed());
  m.fill_mask(mask);
  EXPECT_EQ(allowed_ids(mask, m.vocab_size()), std::vector<int32_t>{eos});
  EXPECT_FALSE(m.accept(*tok.token_to_id("c")));  // rejected, state unchanged
  m.rollback(ids.size());
  m.fill_mask(mask);
  EXPECT_EQ(mask, first);
  EXPECT_FALSE(m.completed());
}

TEST(Grammar, ApplyTokenMaskIsTheBitwiseMask) {
  // Whole words of ones and of zeros, mixed words, and a row that ends inside a word.
  std::mt19937 rng(3);
  for (size_t n : {1u, 31u, 32u, 33u, 100u, 1000u}) {
    std::vector<uint32_t> mask((n + 31) / 32);
    for (size_t w = 0; w < mask.size(); ++w)
      mask[w] = w % 3 == 0 ? 0xffffffffu : w % 3 == 1 ? 0u : static_cast<uint32_t>(rng());
    std::vector<float> row(n, 1.0f);
    apply_token_mask(mask, row);
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(row[i] == 1.0f, allowed(mask, static_cast<int32_t>(i))) << "n " << n << " i " << i;
  }
  std::vector<float> row(33);
  EXPECT_THROW(apply_token_mask(std::vector<uint32_t>(1), row), Error);
}

// Prefetched masks (filled on the mask workers) are the masks filled in place, whatever runs
// beside them: many matchers prefetching at once, rollbacks and accepts over a prefetch, and
// matchers destroyed with their fill queued or running.
TEST(Grammar, PrefetchedMasksEqualMasksFilledInPlace) {
  SKIP_WITHOUT_XGRAMMAR();
  const Tokenizer& tok = qwen3();
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  const auto V = static_cast<int64_t>(tok.id_limit());
  GrammarCompiler c(tok, V, {eos});
  auto g = c.compile(schema(R"({"type":"object","properties":{"name":{"type":"string"},
      "tags":{"type":"array","items":{"enum":["a","bb","ccc"]},"maxItems":3},
      "n":{"type":"integer"}},"required":["name","tags","n"]})"));
  constexpr int kStreams = 12;
  std::vector<std::optional<GrammarMatcher>> ms(kStreams);
  for (auto& m : ms) m.emplace(g);
  std::vector<uint32_t> want(ms[0]->mask_words());
  std::vector<float> row(static_cast<size_t>(V));
  std::mt19937 rng(11);
  for (int step = 0; step < 24; ++step) {
    for (auto& m : ms) m->prefetch();
    for (int i = 0; i < kStreams; ++i) {
      GrammarMatcher& m = *ms[static_cast<size_t>(i)];
      if (m.terminated()) continue;
      std::fill(row.begin(), row.end(), 0.0f);
      m.apply_mask(row);  // the prefetched mask
      const bool restricts = m.fill_mask(want);
      std::vector<int32_t> ok;
      for (int32_t t = 0; t < V; ++t) {
        ASSERT_EQ(row[static_cast<size_t>(t)] == 0.0f, !restricts || allowed(want, t))
            << "stream " << i << " step " << step << " token " << t;
        if (row[static_cast<size_t>(t)] == 0.0f) ok.push_back(t);
      }
      ASSERT_FALSE(ok.empty());
      const int32_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      ASSERT_TRUE(m.accept(pick));
      if (step % 5 == 4 && !m.terminated()) {
        // Roll back over a fill in flight; the same mask comes back.
        m.prefetch();
        m.rollback(1);
        ASSERT_TRUE(m.accept(pick));
      }
    }
    // A stream goes away with its fill queued or running, and a new one takes its place.
    const size_t gone = static_cast<size_t>(step) % kStreams;
    ms[gone]->prefetch();
    ms[gone].reset();
    ms[gone].emplace(g);
  }
}

TEST(Grammar, ByteFallbackVocabulary) {
  SKIP_WITHOUT_XGRAMMAR();
  // SentencePiece-style: U+2581 for a space, <0xNN> byte tokens, Metaspace's prepended space.
  const Tokenizer tok = Tokenizer::from_file("tests/data/tokenizers/sp_bpe/tokenizer.json");
  const int64_t V = static_cast<int64_t>(tok.id_limit());
  const int32_t eos = *tok.token_to_id("</s>");
  GrammarCompiler c(tok, V, {eos});
  auto g = c.compile({.kind = GrammarSpec::Kind::kRegex, .text = "hello wörld!\n"});
  for (uint32_t seed = 0; seed < 10; ++seed) {
    auto [ids, ended] = random_walk(g, eos, seed, 64);
    ASSERT_TRUE(ended);
    // No walk starts with a space token: the grammar's text is the tokens' bytes.
    EXPECT_EQ(tok.decode(ids, false), "hello wörld!\n");
  }
}

TEST(Grammar, BadGrammarsNameTheField) {
  SKIP_WITHOUT_XGRAMMAR();
  const Tokenizer& tok = demo();
  GrammarCompiler c(tok, static_cast<int64_t>(tok.id_limit()), {*tok.eos_id()});
  auto message = [&](const GrammarSpec& s) {
    try {
      c.compile(s);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(schema("{not json")).find("guided_json"), std::string::npos);
  EXPECT_NE(message(schema(R"({"type":"object","properties":{"a":{"not":{}}}})")).find("'not'"),
            std::string::npos);
  EXPECT_NE(message(schema(R"({"type":"array","uniqueItems":true})")).find("uniqueItems"),
            std::string::npos);
  EXPECT_NE(message(schema(R"({"type":"number","multipleOf":0.5})")).find("multipleOf"),
            std::string::npos);
  EXPECT_NE(message(schema(R"({"type":"frobnicate"})")).find("guided_json"), std::string::npos);
  const std::string ebnf =
      message({.kind = GrammarSpec::Kind::kEbnf, .text = "root ::= (", .field = "guided_grammar"});
  EXPECT_TRUE(ebnf.starts_with("guided_grammar: ")) << ebnf;
  EXPECT_EQ(ebnf.find(".cc:"), std::string::npos) << ebnf;
  EXPECT_NE(message({.kind = GrammarSpec::Kind::kRegex, .text = "(", .field = "guided_regex"})
                .find("guided_regex"),
            std::string::npos);
  EXPECT_NE(message({.kind = GrammarSpec::Kind::kChoice, .field = "guided_choice"}).find("empty"),
            std::string::npos);
  // A \x escape past U+10FFFF (xgrammar reads every hex digit after \x into an int that
  // overflows): refused before xgrammar sees it, naming the field and where.
  const std::string hex = message(
      {.kind = GrammarSpec::Kind::kRegex, .text = "a\\x222222222222z", .field = "guided_regex"});
  EXPECT_TRUE(hex.starts_with("guided_regex: the escape '\\x222222222222'")) << hex;
  EXPECT_NE(message({.kind = GrammarSpec::Kind::kEbnf,
                     .text = "root ::= [\\x110000]",
                     .field = "guided_grammar"})
                .find("U+10FFFF"),
            std::string::npos);
  const std::string pattern = message(
      schema(R"({"type":"object","properties":{"a":{"type":"string","pattern":"\\x7fffffff"}}})"));
  EXPECT_TRUE(pattern.starts_with("guided_json ('pattern' at '/properties/a'): the escape"))
      << pattern;
  EXPECT_EQ(c.cached(), 0u);
  EXPECT_NO_THROW(
      c.compile({.kind = GrammarSpec::Kind::kRegex, .text = "\\x41\\\\x110000", .field = "r"}));
  // A choice with a control byte before hex letters is those bytes (not one codepoint \x01ab).
  {
    auto g = c.compile({.kind = GrammarSpec::Kind::kChoice,
                        .choices = {"\x01"
                                    "ab"}});
    GrammarMatcher m(g);
    for (int32_t id : tok.encode("\x01"
                                 "ab",
                                 false))
      EXPECT_TRUE(m.accept(id));
    EXPECT_TRUE(m.completed());
  }
  // A special token's text is spelled by ordinary tokens, never by the special token.
  const int32_t special = *tok.token_to_id("<|endoftext|>");
  ASSERT_TRUE(tok.is_special(special));
  auto g = c.compile({.kind = GrammarSpec::Kind::kChoice, .choices = {"<|endoftext|>"}});
  for (uint32_t seed = 0; seed < 5; ++seed) {
    auto [ids, ended] = random_walk(g, *tok.eos_id(), seed, 64);
    ASSERT_TRUE(ended);
    EXPECT_TRUE(std::find(ids.begin(), ids.end(), special) == ids.end());
    EXPECT_EQ(tok.decode(ids, false), "<|endoftext|>");
  }
}

// xgrammar 0.2.9 writes a codepoint up to U+00FF as \xNN in the EBNF it generates from a regex
// or a schema, and its EBNF lexer reads every hex digit after \x: in a class, such a codepoint
// followed by a hex digit became one wrong codepoint ([\u00e9a] matched U+0E9A, not 'é' or 'a'),
// or past 8 digits overflowed an int (fuzz/grammar_compile_fuzz.cc found [\u00EEEEEEe9], a UBSan
// report). scripts/fetch-xgrammar.sh patches the writer to \u00NN.
TEST(Grammar, EscapedCodepointBeforeAHexDigitInAClass) {
  SKIP_WITHOUT_XGRAMMAR();
  const Tokenizer& tok = demo();
  GrammarCompiler c(tok, static_cast<int64_t>(tok.id_limit()), {*tok.eos_id()});
  auto accepts = [&](const std::string& regex, const std::string& text) {
    GrammarMatcher m(c.compile({.kind = GrammarSpec::Kind::kRegex, .text = regex, .field = "r"}));
    for (int32_t id : tok.encode(text, false))
      if (!m.accept(id)) return false;
    return m.completed();
  };
  EXPECT_TRUE(accepts("[\\u00e9a]+", "a\u00e9a"));
  EXPECT_FALSE(accepts("[\\u00e9a]+", "\u0e9a"));
  EXPECT_TRUE(accepts("[\\u0001b]+",
                      "\x01"
                      "b"));
  EXPECT_FALSE(accepts("[\\u0001b]+", "\x1b"));
  EXPECT_TRUE(accepts("[\\u00EEEEEEe9]+", "\u00eeE9e"));
  EXPECT_FALSE(accepts("[\\u00EEEEEEe9]+", "a"));
}

// Generation: the mask comes after the penalties and the bias (a +100 bias cannot bring back
// a disallowed token), accept() advances the matcher and rollback() undoes it.
TEST(Grammar, GenerationMasksAndRollsBack) {
  SKIP_WITHOUT_XGRAMMAR();
  const Tokenizer& tok = demo();
  const int64_t V = static_cast<int64_t>(tok.id_limit());
  const int32_t eos = *tok.eos_id();
  GrammarCompiler c(tok, V, {eos});
  auto g = c.compile({.kind = GrammarSpec::Kind::kChoice, .choices = {"LORD", "Moses"}});
  const int32_t banned = *tok.token_to_id("the");
  const std::vector<std::pair<int32_t, float>> bias = {{banned, 100.0f}};
  Generation gen({.logit_bias = bias, .eos_ids = {eos}, .max_tokens = 32, .grammar = g}, {1, 2, 3},
                 &tok);
  PickScratch scratch(V);
  std::mt19937 rng(7);
  std::vector<float> row(static_cast<size_t>(V));
  std::vector<int32_t> picks;
  while (!gen.ended()) {
    for (float& x : row) x = std::uniform_real_distribution<float>(-3, 3)(rng);
    const int32_t t = gen.pick(row, scratch);
    EXPECT_NE(t, banned);
    picks.push_back(t);
    gen.accept(t);
    if (picks.size() == 1) {
      // Undo the first token and take it again: the same mask follows.
      gen.rollback(1);
      gen.accept(t);
    }
  }
  EXPECT_EQ(gen.end(), StopReason::kEos);
  EXPECT_TRUE(gen.text() == "LORD" || gen.text() == "Moses") << gen.text();
  EXPECT_TRUE(gen.matcher()->terminated());
  // A token the grammar refuses is an error, not a silent relaxation.
  Generation other({.eos_ids = {eos}, .max_tokens = 8, .grammar = g}, {1}, &tok);
  EXPECT_THROW(other.accept(banned), Error);
}

TEST(Grammar, SchemaKeywordCheckNamesThePath) {
  try {
    check_schema_keywords(R"({"properties":{"a":{"items":{"contains":{}}}}})", "response_format");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("/properties/a/items"), std::string::npos) << e.message();
    EXPECT_TRUE(e.message().starts_with("response_format: ")) << e.message();
  }
  // Keys inside enum / const are data.
  check_schema_keywords(R"({"enum":[{"not":1}],"properties":{"not":{"type":"string"}}})", "f");
}

TEST(Grammar, StructuralTagTokensAreMatchedByIdAlone) {
  SKIP_WITHOUT_XGRAMMAR();
  // Qwen3's <|im_start|> is special, <tool_call> is not. A "token" element of either allows
  // that id alone; text elements (any text, a regex over every character, a JSON string)
  // never allow a special token, even in the vocabulary view where they have text.
  const Tokenizer& tok = qwen3();
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  const int32_t im_start = *tok.token_to_id("<|im_start|>");
  const int32_t endoftext = *tok.token_to_id("<|endoftext|>");
  const int32_t tool_call = *tok.token_to_id("<tool_call>");
  GrammarCompiler c(tok, static_cast<int64_t>(tok.id_limit()), {eos});
  auto tag = [](const std::string& format) {
    return GrammarSpec{.kind = GrammarSpec::Kind::kStructuralTag,
                       .text = R"({"type":"structural_tag","format":)" + format + "}",
                       .field = "tool_choice"};
  };
  const GrammarSpec spec = tag(R"({"type":"sequence","elements":[
      {"type":"token","token":"<|im_start|>"},{"type":"token","token":"<tool_call>"},
      {"type":"regex","pattern":"[\\s\\S]{0,3}"},
      {"type":"json_schema","json_schema":{"type":"string","maxLength":3}},
      {"type":"tag","begin":"<b>","content":{"type":"any_text"},"end":"</b>"}]})");
  auto g = c.compile(spec);
  EXPECT_EQ(c.compile(spec), g);  // cached by its text
  EXPECT_NE(c.compile(tag(R"({"type":"token","token":"<|im_start|>"})")), g);
  EXPECT_EQ(c.cached(), 2u);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_mask(mask);
  EXPECT_EQ(allowed_ids(mask, m.vocab_size()), std::vector<int32_t>{im_start});
  ASSERT_TRUE(m.accept(im_start));
  m.fill_mask(mask);
  EXPECT_EQ(allowed_ids(mask, m.vocab_size()), std::vector<int32_t>{tool_call});
  // The same text spelled by other tokens is refused.
  GrammarMatcher spelled(g);
  ASSERT_TRUE(spelled.accept(im_start));
  EXPECT_FALSE(spelled.accept(tok.encode("<", false)[0]));
  ASSERT_TRUE(m.accept(tool_call));
  for (uint32_t seed = 0; seed < 4; ++seed) {
    auto [ids, ended] = random_walk(g, eos, seed, 60);
    for (size_t i = 2; i < ids.size(); ++i) {
      EXPECT_NE(ids[i], im_start);
      EXPECT_NE(ids[i], endoftext);
    }
  }
  for (int step = 0; step < 8; ++step) {
    m.fill_mask(mask);
    EXPECT_FALSE(allowed(mask, im_start)) << step;
    EXPECT_FALSE(allowed(mask, endoftext)) << step;
    std::vector<int32_t> ok = allowed_ids(mask, m.vocab_size());
    ASSERT_FALSE(ok.empty());
    ASSERT_TRUE(m.accept(ok[ok.size() / 2]));
  }
  // A "token" whose text no single token has is that text; a keyword the engine would ignore
  // inside a json_schema element is refused, named.
  auto text_g = c.compile(tag(R"({"type":"token","token":"<not one token>"})"));
  GrammarMatcher t(text_g);
  for (int32_t id : tok.encode("<not one token>", false)) EXPECT_TRUE(t.accept(id));
  EXPECT_TRUE(t.completed());
  try {
    c.compile(tag(R"({"type":"json_schema","json_schema":{"type":"array","uniqueItems":true}})"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("tool_choice"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("uniqueItems"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace metrale
