#include "quant/py_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace metrale {

struct PyRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

PyRegex::PyRegex(const std::string& pattern, const std::string& where)
    : pattern_(pattern), code_(std::make_unique<Code>()) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), 0, &err,
                              &offset, nullptr);
  if (code_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw make_error(where, ": regex '", pattern, "' does not compile at offset ", offset, ": ",
                     reinterpret_cast<const char*>(msg));
  }
}

PyRegex::~PyRegex() = default;
PyRegex::PyRegex(PyRegex&&) noexcept = default;
PyRegex& PyRegex::operator=(PyRegex&&) noexcept = default;

bool PyRegex::match(std::string_view s, bool full, std::string* group1) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  const uint32_t opts = PCRE2_ANCHORED | (full ? PCRE2_ENDANCHORED : 0u);
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, opts,
                             md, nullptr);
  if (rc >= 2 && group1 != nullptr) {
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[2] != PCRE2_UNSET) *group1 = std::string(s.substr(ov[2], ov[3] - ov[2]));
  }
  pcre2_match_data_free(md);
  return rc >= 0;
}

}  // namespace metrale
