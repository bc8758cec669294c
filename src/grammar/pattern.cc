#include "grammar/pattern.h"

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/error.h"

namespace metrale::grammar {
namespace {

int hex_value(char h) {
  const auto u = static_cast<unsigned char>(h);
  if (!std::isxdigit(u)) return -1;
  return std::isdigit(u) ? h - '0' : std::tolower(u) - 'a' + 10;
}

// The codepoint of a \xHH, \uHHHH or \u{H...} escape at `at` (the backslash), and its length;
// -1 when it is not one of those.
int64_t numeric_escape(std::string_view p, size_t at, size_t& len) {
  if (at + 1 >= p.size()) return -1;
  const char kind = p[at + 1];
  size_t digits = kind == 'x' ? 2 : kind == 'u' ? 4 : 0;
  size_t first = at + 2;
  if (kind == 'u' && first < p.size() && p[first] == '{') {
    const size_t close = p.find('}', first);
    if (close == std::string_view::npos) return -1;
    ++first;
    digits = close - first;
    len = close + 1 - at;
  } else {
    len = 2 + digits;
  }
  if (digits == 0 || digits > 8 || first + digits > p.size()) return -1;
  int64_t v = 0;
  for (size_t i = first; i < first + digits; ++i) {
    const int h = hex_value(p[i]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

std::string escaped(int64_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, cp <= 0xFFFF ? "\\u%04llx" : "\\u{%llx}",
                static_cast<unsigned long long>(cp));
  return buf;
}

// One member of a class: its text and, for a single codepoint, its value (-1: a class escape
// such as \d).
struct Member {
  std::string text;
  int64_t value = -1;
};

// The member at `i` (inside a class); advances i past it. UTF-8 sequences are one member.
Member class_member(std::string_view p, size_t& i) {
  if (p[i] == '\\' && i + 1 < p.size()) {
    size_t len = 0;
    const int64_t v = numeric_escape(p, i, len);
    if (v >= 0) {
      Member m{std::string(p.substr(i, len)), v};
      i += len;
      return m;
    }
    const char e = p[i + 1];
    int64_t value = -1;
    switch (e) {
      case 'n':
        value = '\n';
        break;
      case 'r':
        value = '\r';
        break;
      case 't':
        value = '\t';
        break;
      case 'f':
        value = '\f';
        break;
      case 'v':
        value = '\v';
        break;
      case 'd':
      case 'D':
      case 'w':
      case 'W':
      case 's':
      case 'S':
        value = -1;
        break;
      default:
        value = static_cast<unsigned char>(e);
        break;  // an escaped literal
    }
    Member m{std::string(p.substr(i, 2)), value};
    i += 2;
    return m;
  }
  const auto lead = static_cast<unsigned char>(p[i]);
  const size_t n = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  Member m{std::string(p.substr(i, n)), lead < 0x80 ? lead : 0x80};  // non-ASCII: not c
  i += n;
  return m;
}

}  // namespace

std::string pattern_without(std::string_view p, char c, const std::string& what) {
  const auto cv = static_cast<int64_t>(static_cast<unsigned char>(c));
  const std::string c_text(1, c);
  std::string out;
  size_t i = 0;
  const auto refuse = [&](size_t at, const std::string& why) {
    throw Error(what + ": the pattern " + why + " (at offset " + std::to_string(at) +
                "), and a value here may not hold '" + c_text + "'");
  };
  while (i < p.size()) {
    const char ch = p[i];
    if (ch == '\\') {
      METRALE_CHECK(i + 1 < p.size(), what, ": the pattern ends in a lone backslash");
      size_t len = 0;
      const int64_t v = numeric_escape(p, i, len);
      if (v == cv || (v < 0 && p[i + 1] == c)) refuse(i, "writes '" + c_text + "'");
      if (v >= 0) {
        out.append(p.substr(i, len));
        i += len;
        continue;
      }
      const char e = p[i + 1];
      if (e == 'S' || e == 'W' || e == 'D') {
        out += "[^\\" + std::string(1, static_cast<char>(std::tolower(e))) + c_text + "]";
      } else {
        out.append(p.substr(i, 2));
      }
      i += 2;
    } else if (ch == '.') {
      out += "[^" + c_text + "\\n\\r]";
      ++i;
    } else if (ch == c) {
      refuse(i, "writes '" + c_text + "'");
    } else if (ch == '[') {
      const size_t open = i++;
      const bool negated = i < p.size() && p[i] == '^';
      if (negated) ++i;
      std::vector<Member> members;
      std::vector<bool> range_start;  // members[k] and members[k + 1] form a range
      while (i < p.size() && p[i] != ']') {
        if (p[i] == '-' && !members.empty() && i + 1 < p.size() && p[i + 1] != ']' &&
            !range_start.back()) {
          range_start.back() = true;
          ++i;
          continue;
        }
        members.push_back(class_member(p, i));
        range_start.push_back(false);
      }
      METRALE_CHECK(i < p.size(), what, ": the pattern's class at offset ", open, " never closes");
      ++i;  // ']'
      std::string body;
      for (size_t k = 0; k < members.size(); ++k) {
        const Member& m = members[k];
        if (range_start[k] && k + 1 < members.size()) {
          const Member& hi = members[k + 1];
          if (!negated && m.value >= 0 && hi.value >= 0 && m.value <= cv && cv <= hi.value) {
            if (m.value < cv) body += m.text + "-" + escaped(cv - 1);
            if (hi.value > cv) body += escaped(cv + 1) + "-" + hi.text;
          } else {
            body += m.text + "-" + hi.text;
          }
          ++k;
          continue;
        }
        if (!negated && m.value < 0 && m.text.size() == 2 &&
            (m.text[1] == 'S' || m.text[1] == 'W' || m.text[1] == 'D')) {
          refuse(open,
                 "has " + m.text + " inside a class, which cannot leave '" + c_text + "' out");
        }
        if (!negated && m.value == cv) continue;
        body += m.text;
      }
      if (negated) {
        out += "[^" + c_text + body + "]";
      } else {
        if (body.empty()) refuse(open, "has a class of nothing but '" + c_text + "'");
        out += "[" + body + "]";
      }
    } else {
      out += ch;
      ++i;
    }
  }
  return out;
}

}  // namespace metrale::grammar
