#pragma once
// What reaches xgrammar from outside, checked and prepared (grammar_text.cc); used by
// grammar.cc's compiler, not part of the grammar module's interface (grammar.h).
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/tokenizer.h"

namespace metrale::grammar_detail {

// xgrammar reads "\x" followed by any number of hex digits as one codepoint, in an int that
// overflows: an escape past U+10FFFF in `text` is an Error naming `what`.
void check_hex_escapes(std::string_view text, const std::string& what);

// An EBNF string literal of `s` (UTF-8 kept; quotes, backslashes and control bytes escaped).
std::string ebnf_literal(const std::string& s);

// The bytes each token id below the tokenizer's id limit adds to the output, as xgrammar reads
// them (a RAW vocabulary): GPT-2's byte map and SentencePiece's <0xNN> / U+2581 undone. Special
// tokens add none, or with `markers` keep their text behind the bytes FF FE (which no UTF-8 text
// matches). Checks that `vocab_size` (the logits' width) covers the tokenizer's ids.
std::vector<std::string> vocab_bytes(const Tokenizer& tok, int64_t vocab_size, bool markers);

// A structural tag's JSON as xgrammar compiles it over the `markers` vocabulary: each
// "json_schema" checked as a kJsonSchema spec's schema, each "token" given as text made the id
// of the added token of that text (or that text as a "const_string"), each "any_text" made to
// exclude the special tokens' FF FE. Errors name `field`.
std::string resolve_structural_tag(const std::string& text, const std::string& field,
                                   const std::map<std::string, AddedTokenInfo, std::less<>>& added);

}  // namespace metrale::grammar_detail
