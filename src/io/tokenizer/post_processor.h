#pragma once
// Post-processors of tokenizer.json ("post_processor") for a single sequence: ByteLevel (no
// ids), TemplateProcessing, BertProcessing, RobertaProcessing and Sequence.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/json/json_fields.h"

namespace metrale::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Wraps the ids of one sequence with the special tokens this processor adds.
  virtual void process(std::vector<int32_t>& ids) const = 0;
  // Ids added before / after the sequence (what bos/eos detection reads).
  virtual std::vector<int32_t> prefix_ids() const { return {}; }
  virtual std::vector<int32_t> suffix_ids() const { return {}; }
};

std::unique_ptr<PostProcessor> make_post_processor(const JsonFields& j);

}  // namespace metrale::tok
