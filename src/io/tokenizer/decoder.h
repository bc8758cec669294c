#pragma once
// Decoders of tokenizer.json ("decoder"): ByteLevel, Metaspace, Replace, ByteFallback, Fuse,
// Strip, BPEDecoder and Sequence, each a step over the list of token strings as in HF.
#include <memory>
#include <string>
#include <vector>

#include "io/json/json_fields.h"

namespace metrale::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Decoder> make_decoder(const JsonFields& j);

}  // namespace metrale::tok
