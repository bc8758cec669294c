#include "layers/architecture.h"

#include <algorithm>

namespace metrale {

size_t Architecture::workspace_floats(int64_t max_rows) const {
  size_t most = 0;
  for (const DecoderLayer& l : layers) most = std::max(most, l.workspace_floats(max_rows));
  return most;
}

uint64_t Architecture::active_bytes_per_token() const {
  uint64_t b = 0;
  for (const DecoderLayer& l : layers)
    b += l.mixer().active_bytes_per_token() + l.ffn().active_bytes_per_token();
  return b + lm_head.bytes();
}

LoraSites Architecture::lora_sites() {
  LoraSites out;
  for (DecoderLayer& l : layers) l.lora_sites(out);
  out.linears.push_back(&lm_head);
  return out;
}

}  // namespace metrale
