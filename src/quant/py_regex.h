#pragma once
// PyRegex: a Python `re` pattern compiled with PCRE2, for the patterns checkpoints and adapters
// carry in their configs (compressed-tensors' "re:" targets, ModelOpt globs turned into
// regexes, PEFT's target_modules / rank_pattern / layers_pattern). The syntax those use is
// common to both engines. Matching is anchored at the start, as re.match; `full` also anchors
// the end, as re.fullmatch.
#include <memory>
#include <string>
#include <string_view>

namespace metrale {

class PyRegex {
 public:
  // Throws Error "<where>: regex '<pattern>' does not compile at offset N: <PCRE2's message>".
  PyRegex(const std::string& pattern, const std::string& where);
  ~PyRegex();
  PyRegex(PyRegex&&) noexcept;
  PyRegex& operator=(PyRegex&&) noexcept;

  // re.match (full = false) or re.fullmatch (full = true); group1, when given and the pattern
  // has a first group that took part, receives its text.
  bool match(std::string_view s, bool full = false, std::string* group1 = nullptr) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

}  // namespace metrale
