#pragma once
// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Split, ByteLevel, Digits, Metaspace,
// Whitespace, WhitespaceSplit and Sequence of these. Each one replaces every not-yet-matched
// Split by its sub-splits; splits that carry an added-token id pass through untouched.
#include <memory>
#include <string>
#include <vector>

#include "io/json/json_fields.h"
#include "io/tokenizer/pipeline.h"
#include "io/tokenizer/regex.h"

namespace metrale::tok {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Split>& splits, Arena& arena) const = 0;
  // When this is the last step and maps bytes to GPT-2 characters, the BPE model can take the
  // raw bytes instead: the pipeline calls this to skip the mapping here.
  virtual bool defer_byte_mapping() { return false; }
};

// Builds the pre-tokenizer the object `j` describes. A Sequence is flattened so that a
// trailing ByteLevel can hand its byte mapping to the model (see Tokenizer).
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonFields& j);

// Splits `s` at `matches` (as produced by Regex::find_all, or flags on single characters)
// following HF's SplitDelimiterBehavior; appends the non-empty pieces to `out`.
struct Segment {
  uint32_t start, end;
  bool is_match;
};
void split_segments(const Split& s, const std::vector<Segment>& segments, SplitBehavior behavior,
                    std::vector<Split>& out);

}  // namespace metrale::tok
