#include "chat/lexer.h"

#include <cctype>
#include <cstring>

#include "chat/pystr.h"
#include "core/error.h"

namespace metrale::chat {
namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Python's `\s` (what jinja2's whitespace control strips) at s[p]: its byte length, or 0.
size_t py_space_at(std::string_view s, size_t p) {
  char32_t cp = 0;
  const size_t n = decode_codepoint(s, p, &cp);
  return is_py_space(cp) ? n : 0;
}
size_t skip_py_space(std::string_view s, size_t p) {
  while (p < s.size()) {
    const size_t n = py_space_at(s, p);
    if (n == 0) break;
    p += n;
  }
  return p;
}

// jinja2 normalises every line break to "\n" and drops one trailing newline.
std::string normalize(std::string_view in) {
  std::string s;
  s.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      s += '\n';
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      s += in[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class Lexer {
 public:
  Lexer(std::string src, const std::string& name) : src_(std::move(src)), name_(name) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const char kind = src_[start + 1];  // '{', '%' or '#'
      const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (sign == '-') {
        text = py_strip(text, std::nullopt, false, true);
      } else if (sign != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            skip_py_space(text, l_pos) == text.size()) {
          text.resize(l_pos);
        }
      }
      emit_text(text, pos_);
      size_t p = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", p);
        if (end == std::string::npos) fail(start, "missing end of comment tag '#}'");
        p = end + 2;
        if (end > start + 2 && src_[end - 1] == '-') {
          p = skip_py_space(src_, p);
        } else if (!(end > start + 2 && src_[end - 1] == '+') && p < src_.size() &&
                   src_[p] == '\n') {
          ++p;
        }
      } else {
        tokens_.push_back(
            {kind == '{' ? TokenKind::kVarBegin : TokenKind::kBlockBegin, "", at(start)});
        p = lex_tag(p, kind == '{', start);
      }
      line_starting = p > 0 && src_[p - 1] == '\n';
      pos_ = p;
    }
    tokens_.push_back({TokenKind::kEnd, "", at(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && std::strchr("{%#", src_[i + 1]) != nullptr) return i;
    }
    return std::string::npos;
  }

  SourcePos at(size_t offset) {
    // Positions are mostly asked for in increasing order: one forward scan serves them.
    if (offset < scan_) scan_ = 0, line_ = 1, line_start_ = 0;
    for (; scan_ < offset && scan_ < src_.size(); ++scan_) {
      if (src_[scan_] == '\n') {
        ++line_;
        line_start_ = scan_ + 1;
      }
    }
    return {line_, static_cast<int32_t>(offset - line_start_ + 1)};
  }

  [[noreturn]] void fail(size_t offset, const std::string& what) {
    const SourcePos p = at(offset);
    throw make_error(name_, ":", p.line, ":", p.column, ": ", what);
  }

  void emit_text(const std::string& text, size_t offset) {
    if (!text.empty()) tokens_.push_back({TokenKind::kText, text, at(offset)});
  }

  // Lexes the inside of a {{ }} or {% %} tag from `p`; returns the offset after its end
  // marker (and after the whitespace that marker strips).
  size_t lex_tag(size_t p, bool is_var, size_t tag_start) {
    std::vector<char> brackets;
    const char* close = is_var ? "}}" : "%}";
    while (true) {
      while (p < src_.size() && is_ws(src_[p])) ++p;
      if (p >= src_.size()) fail(tag_start, is_var ? "missing '}}'" : "missing '%}'");
      if (brackets.empty()) {
        const bool minus = src_.compare(p, 3, std::string("-") + close) == 0;
        const bool plus = !is_var && src_.compare(p, 3, "+%}") == 0;
        if (minus || plus || src_.compare(p, 2, close) == 0) {
          tokens_.push_back({is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", at(p)});
          p += (minus || plus) ? 3 : 2;
          if (minus) {
            p = skip_py_space(src_, p);
          } else if (!is_var && !plus && p < src_.size() && src_[p] == '\n') {
            ++p;  // trim_blocks
          }
          return p;
        }
      }
      p = lex_token(p, brackets);
    }
  }

  size_t lex_token(size_t p, std::vector<char>& brackets) {
    const char c = src_[p];
    const size_t begin = p;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (p < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) {
        ++p;
      }
      tokens_.push_back({TokenKind::kName, src_.substr(begin, p - begin), at(begin)});
      return p;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(p);
    if (c == '\'' || c == '"') return lex_string(p);
    static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(p, 2, op) == 0) {
        tokens_.push_back({TokenKind::kOperator, op, at(p)});
        return p + 2;
      }
    }
    if (std::strchr("+-*/%~<>=()[]{},.:|", c) == nullptr) {
      char32_t cp = 0;
      const size_t n = decode_codepoint(src_, p, &cp);
      fail(p, "unexpected character '" + src_.substr(p, n) + "' in a tag");
    }
    if (c == '(' || c == '[' || c == '{') brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail(p, std::string("unexpected '") + c + "'");
      if (brackets.back() != c) {
        fail(p, std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
      }
      brackets.pop_back();
    }
    tokens_.push_back({TokenKind::kOperator, std::string(1, c), at(p)});
    return p + 1;
  }

  size_t lex_number(size_t p) {
    const size_t begin = p;
    auto digits = [&] {
      while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) ||
                                 (src_[p] == '_' && p + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[p + 1]))))) {
        ++p;
      }
    };
    digits();
    bool is_float = false;
    // "messages[0].role" and "x.0.1" are integers followed by attribute access.
    const bool after_dot = begin > 0 && src_[begin - 1] == '.';
    if (!after_dot && p + 1 < src_.size() && src_[p] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
      ++p;
      digits();
      is_float = true;
    }
    if (!after_dot && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = begin; k < p; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    tokens_.push_back({is_float ? TokenKind::kFloat : TokenKind::kInt, text, at(begin)});
    return p;
  }

  size_t lex_string(size_t p) {
    const char quote = src_[p];
    const size_t begin = p++;
    std::string value;
    while (true) {
      if (p >= src_.size()) fail(begin, "unterminated string");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\' || p + 1 >= src_.size()) {
        value += c;
        ++p;
        continue;
      }
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\n':
          break;  // a backslash-newline continues the line
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            if (p + k >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[p + k]))) {
              fail(p - 2, std::string("truncated \\") + e + " escape in a string");
            }
            cp = cp * 16 + static_cast<char32_t>(std::stoi(src_.substr(p + k, 1), nullptr, 16));
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) {
            fail(p - 2, "escape names no Unicode character");
          }
          p += n;
          append_utf8(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {  // octal, up to three digits
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(src_[p++] - '0');
            }
            append_utf8(value, cp);
          } else {  // Python keeps unknown escapes as written
            value += '\\';
            value += e;
          }
      }
    }
    tokens_.push_back({TokenKind::kString, value, at(begin)});
    return p + 1;
  }

  std::string src_;
  const std::string& name_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  size_t scan_ = 0;
  int32_t line_ = 1;
  size_t line_start_ = 0;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source_text, const std::string& source_name) {
  return Lexer(normalize(source_text), source_name).run();
}

}  // namespace metrale::chat
