#pragma once
// A compiled regular expression with the matching semantics `tokenizers` gets from Oniguruma
// (Ruby syntax) through the Rust `onig` crate, implemented on PCRE2 (UTF + UCP + JIT).
//
// Syntax differences are mapped when compiling: `\s`/`\S` mean Unicode White_Space (as in
// Oniguruma; PCRE2 10.42's UCP `\s` misses U+0085), `\w` adds marks, `\h` is Ruby's hex digit.
// Iteration follows onig's `find_iter`: an empty match right where the previous match ended is
// skipped by advancing one character.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/json/json_fields.h"

namespace metrale::tok {

struct Match {
  uint32_t start;
  uint32_t end;
};

class Regex {
 public:
  // Compiles `pattern` (Oniguruma syntax). Throws Error naming `what` and the PCRE2 message.
  static Regex compile(std::string_view pattern, std::string_view what);
  // A regex matching `literal` exactly.
  static Regex literal(std::string_view literal, std::string_view what);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Appends every match in `text` (valid UTF-8) to `out`, in order, non-overlapping.
  void find_all(std::string_view text, std::vector<Match>& out) const;
  // The first match at or after `start`, if any.
  bool find(std::string_view text, size_t start, Match* m) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  struct Code;
  std::unique_ptr<Code> code_;
  std::string pattern_;
};

// The "pattern" field of a Split pre-tokenizer, Replace normalizer or Replace decoder:
// {"String": literal} or {"Regex": oniguruma pattern}.
Regex pattern_field(const JsonFields& owner);

// Rewrites Oniguruma-only syntax into PCRE2 syntax (exposed for tests).
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace metrale::tok
