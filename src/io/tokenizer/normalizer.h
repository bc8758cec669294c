#pragma once
// Normalizers of tokenizer.json ("normalizer"): NFC/NFD/NFKC/NFKD (utf8proc), Replace,
// Prepend, Lowercase, Strip, ByteLevel and Sequence of these.
#include <memory>
#include <string>
#include <string_view>

#include "io/json/json_fields.h"
#include "io/tokenizer/pipeline.h"

namespace metrale::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Returns the normalized text: `in` itself when nothing changes, else text kept in `arena`.
  virtual std::string_view normalize(std::string_view in, Arena& arena) const = 0;
};

// Builds the normalizer the object `j` describes; errors name its path (an unknown "type" is
// reported with its name).
std::unique_ptr<Normalizer> make_normalizer(const JsonFields& j);

// Unicode normalization of valid UTF-8 (exposed for tests). `form` is "NFC", "NFD", "NFKC"
// or "NFKD".
std::string unicode_normalize(std::string_view text, std::string_view form);
// True when every code point of `text` is one whose NFC form is itself in any context
// (the fast path that lets most text skip utf8proc).
bool nfc_inert(std::string_view text);

}  // namespace metrale::tok
