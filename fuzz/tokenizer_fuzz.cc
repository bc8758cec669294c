// Encodes arbitrary bytes with the Qwen3 tokenizer (loaded once) and decodes the result.
// The fixture is found under the source tree (fuzz_source.h).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "../tests/io/tokenizer/gzip_file.h"
#include "fuzz_source.h"
#include "io/tokenizer/tokenizer.h"

namespace {

const metrale::Tokenizer& qwen3() {
  static const metrale::Tokenizer tok = metrale::Tokenizer::from_json(
      metrale::testing::read_gzip_file(
          metrale::fuzz::source_path("tests/data/tokenizers/qwen3/tokenizer.json.gz")),
      "qwen3");
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const metrale::Tokenizer& tok = qwen3();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto ids = tok.encode(text, true);
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= tok.id_limit()) std::abort();
  }
  // Every id encode produced must decode (decode throws only on unknown ids).
  (void)tok.decode(ids, false);
  return 0;
}
