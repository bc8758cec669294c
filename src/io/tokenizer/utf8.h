#pragma once
// UTF-8 helpers shared by the tokenizer stages. Everything past `sanitize_utf8` may assume
// valid UTF-8: the tokenizer replaces invalid input before any stage sees it.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace metrale::tok {

// Decodes the code point starting at s[i] (valid UTF-8 assumed) and returns its byte length.
inline size_t utf8_decode(std::string_view s, size_t i, char32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  auto cont = [&](size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F);
  };
  if (b0 < 0xE0) {
    *cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
    return 2;
  }
  if (b0 < 0xF0) {
    *cp = (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    return 3;
  }
  *cp = (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
  return 4;
}

// Byte length of the code point whose lead byte is `b0` (valid UTF-8 assumed).
inline size_t utf8_len(unsigned char b0) {
  return b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
}

void utf8_append(std::string& out, char32_t cp);

// Returns the number of valid leading bytes of `s` (s.size() when all of it is valid).
size_t utf8_valid_prefix(std::string_view s);

// Replaces every maximal invalid subsequence by U+FFFD, exactly as Python's
// bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy do.
std::string utf8_lossy(std::string_view s);

// Unicode White_Space (what Rust's char::is_whitespace and regex `\s` test).
bool is_white_space(char32_t c);
// Rust char::is_numeric: general category Nd, Nl or No.
bool is_numeric(char32_t c);
// Rust regex `\w` (Unicode): letters, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t c);

// GPT-2's reversible byte <-> printable code point mapping.
const std::array<char32_t, 256>& byte_to_char();
// The byte a code point stands for, or -1 when the code point is not in the mapping.
int char_to_byte(char32_t c);
// byte_to_char()[b] as UTF-8 (1 or 2 bytes).
const std::array<std::string, 256>& byte_to_utf8();

}  // namespace metrale::tok
