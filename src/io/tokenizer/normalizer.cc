#include "io/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "io/tokenizer/regex.h"
#include "io/tokenizer/utf8.h"

namespace metrale::tok {

namespace {

// Code points with canonical combining class 0, no canonical decomposition, and that never
// compose with a neighbour: NFC leaves any string made only of these unchanged. Checked
// exhaustively against utf8proc in normalizer_test.cc.
bool inert_code_point(char32_t c) {
  return c < 0x300 || (c >= 0x3000 && c <= 0x3029) || (c >= 0x3030 && c <= 0x303F) ||
         (c >= 0x3041 && c <= 0x3096) || (c >= 0x30A1 && c <= 0x30FA) ||
         (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) ||
         (c >= 0xFF01 && c <= 0xFF60) || (c >= 0x1F300 && c <= 0x1FAFF);
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(std::string form) : form_(std::move(form)) {}
  std::string_view normalize(std::string_view in, Arena& arena) const override {
    if (is_ascii(in) || (form_ == "NFC" && nfc_inert(in))) return in;
    return arena.keep(unicode_normalize(in, form_));
  }

 private:
  std::string form_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  std::string_view normalize(std::string_view in, Arena& arena) const override {
    thread_local std::vector<Match> matches;
    const ScratchScope scratch(matches);
    matches.clear();
    re_.find_all(in, matches);
    if (matches.empty()) return in;
    std::string out;
    size_t prev = 0;
    for (const Match& m : matches) {
      out.append(in.substr(prev, m.start - prev));
      out.append(content_);
      prev = m.end;
    }
    out.append(in.substr(prev));
    return arena.keep(std::move(out));
  }

 private:
  Regex re_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string_view normalize(std::string_view in, Arena& arena) const override {
    if (in.empty()) return in;
    return arena.keep(prefix_ + std::string(in));
  }

 private:
  std::string prefix_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string_view normalize(std::string_view in, Arena& arena) const override {
    std::string out;
    out.reserve(in.size());
    for (size_t i = 0; i < in.size();) {
      char32_t c;
      i += utf8_decode(in, i, &c);
      if (c == 0x130) {  // Rust's to_lowercase: 'İ' becomes "i\u0307", two code points
        out += "i\xCC\x87";
        continue;
      }
      utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
    if (out == in) return in;
    return arena.keep(std::move(out));
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string_view normalize(std::string_view in, Arena&) const override {
    size_t b = 0, e = in.size();
    if (left_) {
      while (b < e) {
        char32_t c;
        const size_t n = utf8_decode(in, b, &c);
        if (!is_white_space(c)) break;
        b += n;
      }
    }
    if (right_) {
      while (e > b) {
        size_t s = e - 1;
        while (s > b && (static_cast<unsigned char>(in[s]) & 0xC0) == 0x80) --s;
        char32_t c;
        utf8_decode(in, s, &c);
        if (!is_white_space(c)) break;
        e = s;
      }
    }
    return in.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  std::string_view normalize(std::string_view in, Arena& arena) const override {
    std::string out;
    out.reserve(in.size() * 2);
    for (char c : in) out += byte_to_utf8()[static_cast<unsigned char>(c)];
    return arena.keep(std::move(out));
  }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string_view normalize(std::string_view in, Arena& arena) const override {
    for (const auto& p : parts_) in = p->normalize(in, arena);
    return in;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

bool nfc_inert(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    char32_t c;
    i += utf8_decode(text, i, &c);
    if (!inert_code_point(c)) return false;
  }
  return true;
}

std::string unicode_normalize(std::string_view text, std::string_view form) {
  int options = UTF8PROC_STABLE;
  if (form == "NFC")
    options |= UTF8PROC_COMPOSE;
  else if (form == "NFD")
    options |= UTF8PROC_DECOMPOSE;
  else if (form == "NFKC")
    options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  else if (form == "NFKD")
    options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  else
    throw make_error("unknown Unicode normalization form '", form, "'");
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  METRALE_CHECK(n >= 0, form, " normalization failed: ", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::unique_ptr<Normalizer> make_normalizer(const JsonFields& j) {
  const std::string type = j.req_string("type");
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(type);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const JsonList list = j.req_list("normalizers");
    for (size_t i = 0; i < list.size(); ++i) {
      if (std::optional<JsonFields> part = list.opt_object(i))
        parts.push_back(make_normalizer(*part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(pattern_field(j), j.req_string("content"));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(j.req_string("prepend"));
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(j.bool_or("strip_left", true),
                                             j.bool_or("strip_right", true));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  throw j.error("type", "unsupported normalizer type '", type,
                "' (supported: NFC, NFD, NFKC, NFKD, Sequence, Replace, Prepend, Lowercase, Strip, "
                "ByteLevel)");
}

}  // namespace metrale::tok
