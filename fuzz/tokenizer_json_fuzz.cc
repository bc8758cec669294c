// libFuzzer target for tokenizer.json loading: any bytes must yield a Tokenizer or a
// metrale::Error. A tokenizer that loads must then encode fixed texts (ASCII, CJK, emoji,
// invalid UTF-8, its own added tokens) into ids below id_limit() and decode them without
// crashing: a fuzzed file can combine normalizers, pre-tokenizers, models and decoders in
// ways no real checkpoint does, and every pairing must stay memory-safe.
//
// Seeds: fuzz/corpus/tokenizer_json_fuzz/ (tiny byte-level and SentencePiece-style files), e.g.
//   ./tokenizer_json_fuzz -max_len=16384 fuzz/corpus/tokenizer_json_fuzz
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/tokenizer/tokenizer.h"

namespace {

constexpr std::string_view kTexts[] = {
    "In the beginning God created the heaven and the earth.",
    "  leading spaces, tabs\t\tand\nnew lines\r\n",
    "\xe4\xbd\xa0\xe5\xa5\xbd \xe4\xb8\x96\xe7\x95\x8c don't 12345 \xf0\x9f\x98\x80",
    "\xff\xfe broken \xc3 utf-8 \xed\xa0\x80",
    "",
};

void check_round_trip(const metrale::Tokenizer& tok, std::string_view text) {
  for (const bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(text, special);
    for (const int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= tok.id_limit()) std::abort();
    }
    try {
      (void)tok.decode(ids, !special);
    } catch (const metrale::Error&) {
      // decode refuses ids missing from the vocabulary; a fuzzed vocabulary may have holes.
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json_text(reinterpret_cast<const char*>(data), size);
  try {
    const metrale::Tokenizer tok = metrale::Tokenizer::from_json(json_text, "fuzz/tokenizer.json");
    for (const std::string_view text : kTexts) check_round_trip(tok, text);
    std::string all_added;
    for (const metrale::AddedTokenInfo& t : tok.added_tokens()) {
      if (tok.token_to_id(t.content) != t.id) std::abort();
      all_added += t.content;
      all_added += ' ';
    }
    check_round_trip(tok, all_added);
    (void)tok.bos_id();
    (void)tok.eos_id();
    (void)tok.vocab_size();
  } catch (const metrale::Error&) {
  }
  return 0;
}
