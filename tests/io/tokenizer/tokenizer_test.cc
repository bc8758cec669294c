// Loading from files (with tokenizer_config.json), bad input, thread safety and the
// NFC fast path. Exact ids against `tokenizers` live in golden_test.cc.
#include "io/tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <utf8proc.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "gzip_file.h"
#include "io/tokenizer/normalizer.h"
#include "io/tokenizer/utf8.h"

namespace metrale {
namespace {

namespace fs = std::filesystem;

// Unpacks tests/data/tokenizers/<name>/ into a temporary folder laid out like a model
// repository (tokenizer.json + tokenizer_config.json) and returns the tokenizer.json path.
std::string unpack(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("metrale_tok_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string src = "tests/data/tokenizers/" + name + "/";
  std::ofstream(dir / "tokenizer.json", std::ios::binary)
      << testing::read_gzip_file(src + "tokenizer.json.gz");
  fs::copy_file(src + "tokenizer_config.json", dir / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  return (dir / "tokenizer.json").string();
}

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::from_file(unpack("qwen3"));
  return t;
}

TEST(TokenizerFile, Qwen3ReadsConfigNextToIt) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.config().eos_token, "<|im_end|>");
  EXPECT_EQ(t.config().pad_token, "<|endoftext|>");
  EXPECT_FALSE(t.config().bos_token.has_value());
  ASSERT_TRUE(t.config().chat_template.has_value());
  EXPECT_NE(t.config().chat_template->find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(t.eos_id(), t.token_to_id("<|im_end|>"));
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_FALSE(t.post_processor_adds_bos());
  EXPECT_EQ(t.added_tokens().size(), 26u);
  EXPECT_EQ(t.id_limit(), t.vocab_size());
}

TEST(TokenizerFile, DeepSeekConfigGivesBos) {
  const Tokenizer t = Tokenizer::from_file(unpack("deepseek_v3"));
  EXPECT_EQ(t.config().add_bos_token, true);
  EXPECT_EQ(t.bos_id(), t.token_to_id("<｜begin▁of▁sentence｜>"));
  EXPECT_EQ(t.eos_id(), t.token_to_id("<｜end▁of▁sentence｜>"));
  // tokenizers' own post-processor (ByteLevel) adds no bos; the config asks callers to.
  EXPECT_FALSE(t.post_processor_adds_bos());
  EXPECT_TRUE(t.is_special(*t.bos_id()));
}

TEST(TokenizerFile, MissingFileNamesPath) {
  try {
    Tokenizer::from_file("/nonexistent/tokenizer.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

TEST(TokenizerEncode, EmptyAndRoundTrip) {
  const Tokenizer& t = qwen3();
  EXPECT_TRUE(t.encode("", false).empty());
  EXPECT_EQ(t.decode({}, false), "");
  const std::string text = "Round trip: 你好 🙂 x = 42;\n\tdone";
  EXPECT_EQ(t.decode(t.encode(text, false), false), text);
}

TEST(TokenizerEncode, ThreadsAgreeWithSerial) {
  const Tokenizer& t = qwen3();
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back("thread " + std::to_string(i * 7919) + " <|im_start|>héllo wörld " +
                    std::string(i % 9, ' '));
  std::vector<std::vector<int32_t>> serial;
  for (const auto& s : texts) serial.push_back(t.encode(s, true));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          mismatches[k] += t.encode(texts[i], true) != serial[i];
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(TokenizerDecode, OutOfRangeIdIsAnError) {
  const Tokenizer& t = qwen3();
  const int32_t bad = static_cast<int32_t>(t.id_limit()) + 5;
  const std::vector<int32_t> ids{1, 2, bad};
  try {
    t.decode(ids, false);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ids[2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
  }
  const std::vector<int32_t> negative{-1};
  EXPECT_THROW(t.decode(negative, true), Error);
}

// A minimal valid tokenizer.json with one part swapped, to check each error names its field.
std::string tiny(const std::string& field, const std::string& value) {
  std::string model = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]})";
  std::string j = R"({"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,)"
                  R"("post_processor":null,"decoder":null,"model":)" +
                  model + "}";
  if (field.empty()) return j;
  return "{\"version\":\"1.0\",\"" + field + "\":" + value +
         ",\"model\":" + (field == "model" ? value : model) + "}";
}

void expect_error(const std::string& json, std::initializer_list<std::string> needles) {
  try {
    Tokenizer::from_json(json, "tiny.json");
    ADD_FAILURE() << "no error for " << json;
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(TokenizerBadInput, TinyIsValid) {
  const Tokenizer t = Tokenizer::from_json(tiny("", ""), "tiny.json");
  EXPECT_EQ(t.encode("abab", false), (std::vector<int32_t>{2, 2}));
}

TEST(TokenizerBadInput, MalformedJson) {
  expect_error("{\"version\": \"1.0\", \"model\": {", {"tiny.json", "malformed JSON"});
  expect_error("[1, 2]", {"tiny.json", "expected a JSON object"});
  expect_error("{\"version\":\"2.0\",\"model\":{}}", {"version"});
}

// Deep nesting used to overflow the stack when an error message dumped the value
// (fuzz/tokenizer_json_fuzz); it is refused while parsing, in tokenizer_config.json too.
TEST(TokenizerBadInput, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_error("{\"version\": " + deep + "}", {"tiny.json", "nesting deeper than"});
  try {
    parse_tokenizer_config("{\"bos_token\": " + deep + "}", "tokenizer_config.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(0u, std::string(e.what()).find("tokenizer_config.json: JSON nesting deeper than"))
        << e.what();
  }
}

TEST(TokenizerBadInput, UnknownKindsAreNamed) {
  expect_error(tiny("model", R"({"type":"WordPiece","vocab":{}})"), {"model", "WordPiece"});
  expect_error(tiny("model", R"({"type":"Unigram","vocab":[]})"), {"Unigram"});
  expect_error(tiny("pre_tokenizer", R"({"type":"FancySplit"})"), {"pre_tokenizer", "FancySplit"});
  expect_error(tiny("pre_tokenizer",
                    R"({"type":"Sequence","pretokenizers":[{"type":"Digits"},{"type":"Nope"}]})"),
               {"pretokenizers[1]", "Nope"});
  expect_error(tiny("normalizer", R"({"type":"Precompiled","precompiled_charsmap":""})"),
               {"normalizer", "Precompiled"});
  expect_error(tiny("decoder", R"({"type":"CTC"})"), {"decoder", "CTC"});
  expect_error(tiny("post_processor", R"({"type":"Magic"})"), {"post_processor", "Magic"});
  expect_error(
      tiny("pre_tokenizer",
           R"({"type":"Split","pattern":{"Regex":"x"},"behavior":"Sideways","invert":false})"),
      {"behavior", "Sideways"});
}

TEST(TokenizerBadInput, BadModelFields) {
  expect_error(tiny("model", R"({"type":"BPE","vocab":{"a":0},"merges":["a c"]})"),
               {"merges[0]", "'c'"});
  expect_error(tiny("model", R"({"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]})"),
               {"merges[0]", "'ab'"});
  expect_error(tiny("model", R"({"type":"BPE","vocab":{"a":0},"merges":["a b c"]})"),
               {"merges[0]"});
  expect_error(tiny("model", R"({"type":"BPE","vocab":{"a":-3},"merges":[]})"), {"model.vocab.a"});
  expect_error(tiny("model", R"({"type":"BPE","vocab":{"a":"x"},"merges":[]})"), {"model.vocab.a"});
  expect_error(tiny("model", R"({"type":"BPE","dropout":0.1,"vocab":{"a":0},"merges":[]})"),
               {"dropout"});
  expect_error(tiny("model", R"({"type":"BPE","vocab":{"a":0}})"), {"merges"});
  expect_error(
      tiny(
          "pre_tokenizer",
          R"({"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated","invert":false})"),
      {"pre_tokenizer", "(unclosed"});
  expect_error(
      tiny(
          "post_processor",
          R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}}],"special_tokens":{}})"),
      {"<s>"});
}

TEST(TokenizerBadInput, AddedTokenFields) {
  expect_error(tiny("added_tokens", R"([{"id":5,"content":7}])"), {"added_tokens[0]", "content"});
  expect_error(tiny("added_tokens", R"([{"id":5,"content":"x","lstrip":"yes"}])"),
               {"added_tokens[0]", "lstrip"});
}

// Every code point the NFC fast path skips must be one utf8proc leaves alone with ccc 0.
TEST(Normalizer, NfcFastPathIsExact) {
  int checked = 0;
  for (char32_t c = 1; c < 0x110000; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    std::string s;
    tok::utf8_append(s, c);
    if (!tok::nfc_inert(s)) continue;
    ++checked;
    ASSERT_EQ(utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class, 0)
        << std::hex << static_cast<uint32_t>(c);
    ASSERT_EQ(tok::unicode_normalize(s, "NFC"), s) << std::hex << static_cast<uint32_t>(c);
    // Composition with a neighbour: any inert pair must stay as it is.
    std::string pair = s + (c % 2 ? "\xE3\x81\x8B" : "a");
    ASSERT_EQ(tok::unicode_normalize(pair, "NFC"), pair) << std::hex << static_cast<uint32_t>(c);
  }
  EXPECT_GT(checked, 30000);  // ASCII, Latin, CJK, kana, Hangul, emoji
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  // Python: b"a\xf0\x9f\x98b\xed\xa0\x80c".decode("utf-8", "replace") ==
  // "a\ufffdb\ufffd\ufffd\ufffdc"
  EXPECT_EQ(tok::utf8_lossy("a\xF0\x9F\x98"
                            "b\xED\xA0\x80"
                            "c"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
            "c");
  EXPECT_EQ(tok::utf8_valid_prefix("ok\xC3\xA9\xFF"), 4u);
}

}  // namespace
}  // namespace metrale
