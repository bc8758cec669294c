#include "chat/pystr.h"

#include <utf8proc.h>

#include <algorithm>

namespace metrale::chat {

size_t decode_codepoint(std::string_view s, size_t i, char32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n = 0;
  char32_t c = 0;
  char32_t min = 0;
  if (b0 >= 0xC2 && b0 < 0xE0) {
    n = 2, c = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 < 0xF0) {
    n = 3, c = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 < 0xF5) {
    n = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    *cp = kInvalidByte;
    return 1;
  }
  if (i + n > s.size()) {
    *cp = kInvalidByte;
    return 1;
  }
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *cp = kInvalidByte;
      return 1;
    }
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c < 0xE000)) {
    *cp = kInvalidByte;
    return 1;
  }
  *cp = c;
  return n;
}

std::vector<std::string_view> split_codepoints(std::string_view s) {
  std::vector<std::string_view> out;
  for_each_codepoint(s, [&](char32_t, std::string_view bytes) { out.push_back(bytes); });
  return out;
}

size_t codepoint_count(std::string_view s) {
  size_t n = 0;
  for_each_codepoint(s, [&](char32_t, std::string_view) { ++n; });
  return n;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_printable(char32_t c) {
  if (c == U' ') return true;
  if (c == kInvalidByte) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  std::vector<char32_t> set;
  if (chars) for_each_codepoint(*chars, [&](char32_t cp, std::string_view) { set.push_back(cp); });
  const auto strip_it = [&](char32_t cp) {
    if (!chars) return is_py_space(cp);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  struct Piece {
    char32_t cp;
    size_t begin, end;
  };
  std::vector<Piece> pieces;
  size_t pos = 0;
  for_each_codepoint(s, [&](char32_t cp, std::string_view bytes) {
    pieces.push_back({cp, pos, pos + bytes.size()});
    pos += bytes.size();
  });
  size_t lo = 0;
  size_t hi = pieces.size();
  if (left) {
    while (lo < hi && strip_it(pieces[lo].cp)) ++lo;
  }
  if (right) {
    while (hi > lo && strip_it(pieces[hi - 1].cp)) --hi;
  }
  if (lo == hi) return "";
  return std::string(s.substr(pieces[lo].begin, pieces[hi - 1].end - pieces[lo].begin));
}

namespace {

std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  // Words as byte ranges, then Python's rule: after maxsplit splits the rest is one piece,
  // whitespace and all, from the next word on (or up to the last word, splitting from the right).
  struct Range {
    size_t begin, end;
  };
  std::vector<Range> words;
  size_t pos = 0;
  bool in_word = false;
  for_each_codepoint(s, [&](char32_t cp, std::string_view bytes) {
    if (is_py_space(cp)) {
      in_word = false;
    } else if (!in_word) {
      words.push_back({pos, pos + bytes.size()});
      in_word = true;
    } else {
      words.back().end = pos + bytes.size();
    }
    pos += bytes.size();
  });
  std::vector<std::string> out;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
    for (const Range& w : words) out.emplace_back(s.substr(w.begin, w.end - w.begin));
    return out;
  }
  const size_t n = static_cast<size_t>(maxsplit);
  if (!from_right) {
    for (size_t k = 0; k < n; ++k)
      out.emplace_back(s.substr(words[k].begin, words[k].end - words[k].begin));
    out.emplace_back(s.substr(words[n].begin));
    return out;
  }
  const size_t first_kept = words.size() - n;
  out.emplace_back(s.substr(0, words[first_kept - 1].end));
  for (size_t k = first_kept; k < words.size(); ++k) {
    out.emplace_back(s.substr(words[k].begin, words[k].end - words[k].begin));
  }
  return out;
}

}  // namespace

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right) {
  if (!sep) return split_whitespace(s, maxsplit, from_right);
  const std::string_view d = *sep;
  std::vector<std::string> out;
  if (!from_right) {
    size_t start = 0;
    for (int64_t k = 0; maxsplit < 0 || k < maxsplit; ++k) {
      const size_t at = s.find(d, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + d.size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  size_t end = s.size();
  for (int64_t k = 0; maxsplit < 0 || k < maxsplit; ++k) {
    if (end < d.size()) break;
    const size_t at = s.rfind(d, end - d.size());
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(at + d.size(), end - at - d.size()));
    end = at;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::optional<std::string> py_replace(std::string_view s, std::string_view old,
                                      std::string_view with, int64_t count, size_t max_bytes) {
  std::string out;
  bool too_big = false;
  if (old.empty()) {  // Python inserts `with` before every character and at the end
    int64_t done = 0;
    for_each_codepoint(s, [&](char32_t, std::string_view bytes) {
      if (too_big) return;
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      out += bytes;
      too_big = out.size() > max_bytes;
    });
    if (count < 0 || done < count) out += with;
  } else {
    size_t start = 0;
    for (int64_t k = 0; (count < 0 || k < count) && !too_big; ++k) {
      const size_t at = s.find(old, start);
      if (at == std::string_view::npos) break;
      out += s.substr(start, at - start);
      out += with;
      start = at + old.size();
      too_big = out.size() > max_bytes;
    }
    out += s.substr(start);
  }
  if (too_big || out.size() > max_bytes) return std::nullopt;
  return out;
}

namespace {

template <typename Fn>
std::string map_codepoints(std::string_view s, Fn&& fn) {
  std::string out;
  out.reserve(s.size());
  for_each_codepoint(s, [&](char32_t cp, std::string_view bytes) {
    if (cp == kInvalidByte) {
      out += bytes;
    } else {
      append_utf8(out, fn(cp));
    }
  });
  return out;
}

char32_t upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t title(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
bool is_cased(char32_t c) { return c != kInvalidByte && (upper(c) != c || lower(c) != c); }

}  // namespace

std::string py_upper(std::string_view s) { return map_codepoints(s, upper); }
std::string py_lower(std::string_view s) { return map_codepoints(s, lower); }

std::string py_title(std::string_view s) {
  bool previous_cased = false;
  return map_codepoints(s, [&](char32_t c) {
    const char32_t r = previous_cased ? lower(c) : title(c);
    previous_cased = is_cased(c);
    return r;
  });
}

std::string py_capitalize(std::string_view s) {
  bool first = true;
  return map_codepoints(s, [&](char32_t c) {
    const char32_t r = first ? title(c) : lower(c);
    first = false;
    return r;
  });
}

}  // namespace metrale::chat
