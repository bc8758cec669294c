// libFuzzer target for the structured-output compile path: any bytes, read as a JSON schema,
// a regex (half of them first narrowed by grammar::pattern_without, as a forced XML tool call's
// string pattern is), an EBNF grammar or a choice list (the first byte picks which), must
// compile into a grammar or throw metrale::Error naming the field, never crash, hang or report;
// a grammar that compiles is walked a few steps (mask, accept the first allowed token, roll
// back), every other mask the one the mask workers filled ahead (GrammarMatcher::prefetch).
// The vocabulary is the demo model's (found under the source tree: fuzz_source.h).
//
// Seeds: fuzz/corpus/grammar_compile_fuzz/, e.g.
//   ./grammar_compile_fuzz -max_len=4096 fuzz/corpus/grammar_compile_fuzz
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_source.h"
#include "grammar/grammar.h"
#include "grammar/pattern.h"
#include "io/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using metrale::GrammarSpec;
  static const metrale::Tokenizer tok =
      metrale::Tokenizer::from_file(metrale::fuzz::source_path("models/demo/tokenizer.json"));
  static metrale::GrammarCompiler compiler(tok, static_cast<int64_t>(tok.id_limit()),
                                           {*tok.eos_id()});
  if (size == 0 || !metrale::grammar_available()) return 0;
  GrammarSpec spec;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      spec.kind = GrammarSpec::Kind::kJsonSchema;
      spec.text = text;
      break;
    case 1:
      spec.kind = GrammarSpec::Kind::kRegex;
      spec.text = text;
      // Half the regexes go through the narrowing a forced XML tool call's string pattern
      // takes first (grammar/pattern.h), which refuses with an Error or writes a regex.
      if ((data[0] & 4) != 0) {
        try {
          spec.text = metrale::grammar::pattern_without(text, '<', "fuzz");
        } catch (const metrale::Error&) {
          return 0;
        }
      }
      break;
    case 2:
      spec.kind = GrammarSpec::Kind::kEbnf;
      spec.text = text;
      break;
    default:
      spec.kind = GrammarSpec::Kind::kChoice;
      for (size_t at = 0; at <= text.size();) {
        size_t nl = text.find('\n', at);
        if (nl == std::string::npos) nl = text.size();
        spec.choices.push_back(text.substr(at, nl - at));
        at = nl + 1;
      }
  }
  try {
    metrale::GrammarMatcher m(compiler.compile(spec));
    std::vector<uint32_t> mask(m.mask_words());
    std::vector<float> row(static_cast<size_t>(m.vocab_size()));
    size_t accepted = 0;
    for (int step = 0; step < 8 && !m.terminated(); ++step) {
      // Odd steps take the mask the workers filled ahead (prefetch after the last accept),
      // which must be the one filled in place.
      if (step % 2 == 1) {
        std::fill(row.begin(), row.end(), 0.0f);
        m.apply_mask(row);
      }
      const bool restricts = m.fill_mask(mask);
      if (step % 2 == 1) {
        for (size_t i = 0; i < row.size(); ++i) {
          const bool allowed = !restricts || ((mask[i / 32] >> (i % 32)) & 1u);
          if (allowed != (row[i] == 0.0f)) __builtin_trap();
        }
      }
      int32_t pick = -1;
      for (size_t w = 0; w < mask.size() && pick < 0; ++w)
        for (int b = 0; b < 32 && pick < 0; ++b)
          if ((mask[w] >> b) & 1u) pick = static_cast<int32_t>(w * 32 + static_cast<size_t>(b));
      if (pick < 0 || !m.accept(pick)) break;
      ++accepted;
      m.prefetch();
    }
    m.rollback(accepted);
  } catch (const metrale::Error&) {
  }
  return 0;
}
