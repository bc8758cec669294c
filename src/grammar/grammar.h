#pragma once
// Constrained decoding (structured outputs) over xgrammar's C++ core (docs/dependencies.md):
// a GrammarSpec (JSON object, JSON schema, regex, choice list, EBNF, structural tag) is compiled
// once per tokenizer into a CompiledGrammar (cached by its text); a GrammarMatcher, one per
// stream, gives the token mask of the next step, accepts tokens and rolls back.
//
// The vocabulary: every id below the model's logits width. A special token of the tokenizer
// (and an id the tokenizer does not have) is never allowed inside a structure, only where a
// structural tag names it as a token (Mistral's [TOOL_CALLS]); the eos ids are allowed only
// where the grammar accepts (and then end the stream).
//
// Errors (a bad schema, a grammar that does not parse, an unsupported schema keyword) are
// metrale::Error naming the request field; a grammar is never relaxed to unconstrained.
// Built without xgrammar (scripts/fetch-xgrammar.sh could not fetch it), grammar_available()
// is false and compiling throws saying so.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/tokenizer/tokenizer.h"

namespace metrale {

bool grammar_available();

struct GrammarSpec {
  // kStructuralTag: xgrammar's structural tag JSON ({"type": "structural_tag", "format": ...}),
  // e.g. a tool call's markers around its arguments. A {"type": "token", "token": "<text>"}
  // in it is the tokenizer's token of that text, special or not, matched by id alone (the text
  // spelled out by other tokens does not match it; where no single token has that text, the
  // text itself is the element; as a "tag"'s begin or end a non-special token is its text,
  // which xgrammar 0.2.9 needs to end the tag's any_text); every "json_schema" in it is
  // checked as kJsonSchema's is.
  enum class Kind : uint8_t { kJsonObject, kJsonSchema, kRegex, kChoice, kEbnf, kStructuralTag };
  Kind kind = Kind::kJsonObject;
  std::string
      text;  // the schema (JSON), the regex, the EBNF or the structural tag; kChoice: unused
  std::vector<std::string> choices;  // kChoice: the exact strings, one of which is the output
  // kJsonSchema: literal text before and after the JSON (a tool call's markers).
  std::string prefix, suffix;
  std::string field = "response_format";  // the request field errors name
  // The key of the compile cache.
  std::string key() const;
};

// Rejects schema keywords the engine would silently ignore (not, if/then/else, uniqueItems,
// contains, multipleOf on numbers, ...): Error naming `field` and the keyword's path.
void check_schema_keywords(const std::string& schema_json, const std::string& field);

class CompiledGrammar;  // opaque, shared by every stream using one grammar

class GrammarCompiler {
 public:
  // `vocab_size`: the model's logits width (>= the tokenizer's id_limit()); `eos_ids`: the ids
  // that end a stream (allowed only at an accept state).
  GrammarCompiler(const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> eos_ids);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Compiles `spec` (or returns the cached grammar of the same key). Thread-safe. Throws Error
  // naming spec.field when the schema / regex / grammar is invalid or matches nothing.
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec);
  int64_t vocab_size() const { return vocab_size_; }
  // Grammars in the cache.
  size_t cached() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t vocab_size_;
};

// The next token's mask is filled ahead: prefetch() (Generation calls it once a token is
// accepted) queues the fill on the mask workers, a few threads of this process, so it runs
// beside the next forward and beside the other streams' fills; apply_mask() then only waits
// for it (or, when no worker has taken it yet, fills it on the calling thread) and writes
// -inf over the disallowed logits. A matcher is used by one thread at a time (its owner's);
// every method but vocab_size() and mask_words() first waits for its own fill in flight, and
// the destructor does too (a fill not yet begun is dropped), so a stream going away mid-fill
// frees nothing a worker still reads.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  int64_t vocab_size() const;
  // 32-bit words of a mask: bit i of word i/32 is set where token i is allowed.
  size_t mask_words() const;
  // Fills `mask` (mask_words() words) for the next token; returns false when every token is
  // allowed (the mask need not be applied).
  bool fill_mask(std::span<uint32_t> mask);
  // Starts filling the next token's mask on a mask worker (nothing when it is filled or
  // being filled already, or when the matcher terminated).
  void prefetch();
  // Sets logits of disallowed tokens to -inf (the row has vocab_size() entries), from the
  // prefetched mask when there is one.
  void apply_mask(std::span<float> logits);
  // Advances over `token`; false (and the state unchanged) when the grammar rejects it.
  bool accept(int32_t token);
  // Undoes the last n accepted tokens (a prefetched mask is dropped).
  void rollback(size_t n);
  // An eos was accepted at an accept state: nothing more can follow.
  bool terminated() const;
  // The output so far is a whole match (an eos would be accepted now).
  bool completed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// How many mask workers prefetch() uses: METRALE_GRAMMAR_THREADS when set (an integer in
// [0, 64]; 0: no workers, every mask is filled at the pick on the caller's thread), otherwise
// a quarter of the hardware threads, at least 1 and at most 4 (the forward's thread pool
// keeps the rest; docs/performance.md measures it).
int grammar_mask_threads();

// Writes -inf over the logits of the tokens `mask` disallows (bit i of word i/32 clear),
// a 32-bit word at a time: words of all ones are skipped, words of zeros filled whole.
void apply_token_mask(std::span<const uint32_t> mask, std::span<float> logits);

}  // namespace metrale
