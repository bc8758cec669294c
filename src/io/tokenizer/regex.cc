#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "io/tokenizer/utf8.h"

namespace metrale::tok {

namespace {

// Unicode White_Space, the meaning of `\s` in Oniguruma.
constexpr std::string_view kSpaceSet =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr std::string_view kWordSet = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kHexSet = "0-9a-fA-F";

// Per-thread PCRE2 match state: match data for one ovector pair and a JIT stack big enough
// for long inputs. One per thread keeps Regex::find_all const and thread-safe without locks.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_start = 0;  // index in `p` just after '[' or '[^'
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      auto set = [&](std::string_view s, bool negated) {
        if (in_class) {
          // A negated set inside a class cannot be spliced; PCRE2's own escape is closest.
          if (negated) {
            out.push_back('\\');
            out.push_back(e);
          } else {
            out.append(s);
          }
        } else {
          out.append(negated ? "[^" : "[");
          out.append(s);
          out.push_back(']');
        }
      };
      switch (e) {
        case 's':
          set(kSpaceSet, false);
          break;
        case 'S':
          set(kSpaceSet, true);
          break;
        case 'w':
          set(kWordSet, false);
          break;
        case 'W':
          set(kWordSet, true);
          break;
        case 'h':
          set(kHexSet, false);
          break;
        case 'H':
          set(kHexSet, true);
          break;
        default:
          out.push_back('\\');
          out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      class_start = i + 1;
      continue;
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out.push_back(c);
  }
  return out;
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Regex Regex::compile(std::string_view pattern, std::string_view what) {
  Regex r;
  r.pattern_ = std::string(pattern);
  const std::string translated = onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  r.code_ = std::make_unique<Code>();
  r.code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &offset, nullptr);
  if (r.code_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw make_error(what, ": invalid regex '", pattern, "' at offset ", offset, ": ",
                     reinterpret_cast<const char*>(msg));
  }
  r.code_->jit = pcre2_jit_compile(r.code_->code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

Regex Regex::literal(std::string_view literal, std::string_view what) {
  std::string quoted;
  for (char c : literal) {
    // In PCRE2 a backslash before any ASCII non-alphanumeric makes it literal; UTF-8 bytes
    // and alphanumerics stand for themselves.
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
      quoted.push_back('\\');
    }
    quoted.push_back(c);
  }
  // Built from a literal, so the escapes above are PCRE2's own: skip the Oniguruma mapping.
  Regex r;
  r.pattern_ = std::string(literal);
  int err = 0;
  PCRE2_SIZE offset = 0;
  r.code_ = std::make_unique<Code>();
  r.code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(quoted.data()), quoted.size(),
                                PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  METRALE_CHECK(r.code_->code != nullptr, what, ": cannot compile literal pattern '", literal, "'");
  r.code_->jit = pcre2_jit_compile(r.code_->code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

bool Regex::find(std::string_view text, size_t start, Match* m) const {
  ThreadMatchState& st = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Callers only hand over text that passed UTF-8 validation, so PCRE2 need not re-check it.
  const int rc = code_->jit ? pcre2_jit_match(code_->code, subject, text.size(), start,
                                              PCRE2_NO_UTF_CHECK, st.data, st.context)
                            : pcre2_match(code_->code, subject, text.size(), start,
                                          PCRE2_NO_UTF_CHECK, st.data, st.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    throw make_error("regex '", pattern_, "': matching failed on a ", text.size(),
                     "-byte input: ", reinterpret_cast<const char*>(msg));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  m->start = static_cast<uint32_t>(ov[0]);
  m->end = static_cast<uint32_t>(ov[1]);
  return true;
}

void Regex::find_all(std::string_view text, std::vector<Match>& out) const {
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    Match m;
    if (!find(text, last_end, &m)) return;
    if (m.start == m.end && have_last && last_match_end == m.end) {
      // onig's iterator refuses an empty match right after the previous one and retries one
      // character further on.
      last_end += last_end < text.size() ? utf8_len(static_cast<unsigned char>(text[last_end])) : 1;
      continue;
    }
    last_end = m.end;
    last_match_end = m.end;
    have_last = true;
    out.push_back(m);
  }
}

Regex pattern_field(const JsonFields& owner) {
  const JsonFields pattern = owner.req_object("pattern");
  if (pattern.has("String"))
    return Regex::literal(pattern.req_string("String"), pattern.where("String"));
  return Regex::compile(pattern.req_string("Regex"), pattern.where("Regex"));
}

}  // namespace metrale::tok
