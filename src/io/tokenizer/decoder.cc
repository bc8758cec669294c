#include "io/tokenizer/decoder.h"

#include <optional>

#include "io/tokenizer/regex.h"
#include "io/tokenizer/utf8.h"

namespace metrale::tok {

namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      bool all_mapped = true;
      for (size_t i = 0; i < t.size();) {
        char32_t c;
        i += utf8_decode(t, i, &c);
        const int b = char_to_byte(c);
        if (b < 0) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      // A token with any character outside the byte map (an added token such as
      // "<｜User｜>") contributes its own UTF-8 bytes.
      if (!all_mapped) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, replacement_.size(), replacement_) == 0) {
          // HF drops every replacement character of the first token, not only a leading one.
          if (!(i == 0 && strip_first_)) out.push_back(' ');
          p += replacement_.size();
        } else {
          const size_t n = utf8_len(static_cast<unsigned char>(t[p]));
          out.append(t, p, n);
          p += n;
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<Match> matches;
    for (std::string& t : tokens) {
      matches.clear();
      re_.find_all(t, matches);
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (const Match& m : matches) {
        out.append(t, prev, m.start - prev);
        out += content_;
        prev = m.end;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  Regex re_;
  std::string content_;
};

// Parses HF's "<0xNN>" byte tokens. Rust's u8::from_str_radix also accepts a leading '+'.
int byte_token_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') return hex(t[4]);
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_valid_prefix(pending) == pending.size()) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending.size(); ++k)
          out.emplace_back("\xEF\xBF\xBD");  // one U+FFFD per byte
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      const int b = byte_token_value(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      for (size_t i = 0; i < t.size();) {
        char32_t c;
        const size_t n = utf8_decode(t, i, &c);
        chars.push_back({i, c});
        i += n;
      }
      size_t cut_start = 0, cut_stop = chars.size();
      for (size_t i = 0; i < start_ && i < chars.size() && chars[i].second == content_; ++i)
        cut_start = i + 1;
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        const size_t idx = chars.size() - i - 1;
        if (chars[idx].second != content_) break;
        cut_stop = idx;
      }
      if (cut_stop <= cut_start) {
        t.clear();
        continue;
      }
      const size_t b = chars[cut_start].first;
      const size_t e = cut_stop < chars.size() ? chars[cut_stop].first : t.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string with = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      const std::string& t = tokens[i];
      size_t prev = 0;
      for (size_t p = suffix_.empty() ? std::string::npos : t.find(suffix_); p != std::string::npos;
           p = t.find(suffix_, p + suffix_.size())) {
        out.append(t, prev, p - prev);
        out += with;
        prev = p + suffix_.size();
      }
      out.append(t, prev, std::string::npos);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const JsonFields& j) {
  const std::string type = j.req_string("type");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool strip_first = true;
    if (std::optional<std::string> scheme = j.opt_string("prepend_scheme"))
      strip_first = *scheme != "never";
    if (!j.bool_or("add_prefix_space", true)) strip_first = false;
    return std::make_unique<MetaspaceDecoder>(j.req_string("replacement"), strip_first);
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(pattern_field(j), j.req_string("content"));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::string content = j.req_string("content");
    char32_t c = 0;
    METRALE_CHECK(!content.empty() && utf8_valid_prefix(content) == content.size() &&
                      utf8_decode(content, 0, &c) == content.size(),
                  j.where("content"), ": expected one character, found '", content, "'");
    const auto start = static_cast<size_t>(j.req_int("start", 0));
    const auto stop = static_cast<size_t>(j.req_int("stop", 0));
    return std::make_unique<StripDecoder>(c, start, stop);
  }
  if (type == "BPEDecoder") {
    return std::make_unique<BpeSuffixDecoder>(j.opt_string("suffix").value_or("</w>"));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const JsonList list = j.req_list("decoders");
    for (size_t i = 0; i < list.size(); ++i) {
      if (std::optional<JsonFields> part = list.opt_object(i)) parts.push_back(make_decoder(*part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  throw j.error("type", "unsupported decoder type '", type,
                "' (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, "
                "BPEDecoder, Sequence)");
}

}  // namespace metrale::tok
