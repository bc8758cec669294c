#pragma once
// Python str methods over UTF-8 bytes, counted in code points as Python counts them (length,
// indexing and slicing of "héllo" see 5 characters). Bytes that are not valid UTF-8 (possible
// only in a template's own source; JSON input is validated) count as one character each.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace metrale::chat {

// The "code point" of a byte that is not part of valid UTF-8.
inline constexpr char32_t kInvalidByte = 0x110000;

// Decodes s[i...]: returns the byte length (>= 1) and sets *cp (kInvalidByte when invalid).
size_t decode_codepoint(std::string_view s, size_t i, char32_t* cp);

template <typename Fn>
void for_each_codepoint(std::string_view s, Fn&& fn) {
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const size_t n = decode_codepoint(s, i, &cp);
    fn(cp, s.substr(i, n));
    i += n;
  }
}

// Each character's bytes.
std::vector<std::string_view> split_codepoints(std::string_view s);
size_t codepoint_count(std::string_view s);
void append_utf8(std::string& out, char32_t cp);

bool is_py_space(char32_t cp);   // str.isspace()
bool is_printable(char32_t cp);  // str.isprintable(), per character (what repr() escapes)

// str.strip / lstrip / rstrip: `chars` absent strips whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split / rsplit: `sep` absent splits on runs of whitespace; maxsplit < 0 is unlimited.
// An empty `sep` is an error the caller reports (Python: "empty separator").
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right);
// str.replace(old, new, count): count < 0 replaces all. Returns nullopt when the result
// would exceed `max_bytes` (the caller reports it).
std::optional<std::string> py_replace(std::string_view s, std::string_view old,
                                      std::string_view with, int64_t count, size_t max_bytes);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);

}  // namespace metrale::chat
