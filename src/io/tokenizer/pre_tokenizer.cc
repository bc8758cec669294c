#include "io/tokenizer/pre_tokenizer.h"

#include <optional>

#include "io/tokenizer/utf8.h"

namespace metrale::tok {

namespace {

// The GPT-2 pattern ByteLevel uses when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rebuilds `splits`, passing added-token splits through and replacing each other split by
// what `fn(split, out)` appends.
template <typename Fn>
void rebuild(std::vector<Split>& splits, Fn&& fn) {
  thread_local std::vector<Split> next;
  const ScratchScope scratch(next);  // after the swap: the old splits' buffer
  next.clear();
  next.reserve(splits.size() * 2);
  for (const Split& s : splits) {
    if (s.id >= 0) {
      next.push_back(s);
    } else {
      fn(s, next);
    }
  }
  splits.swap(next);
}

void segments_from_matches(const std::vector<Match>& matches, size_t len, bool invert,
                           std::vector<Segment>& out) {
  out.clear();
  uint32_t prev = 0;
  for (const Match& m : matches) {
    if (prev != m.start) out.push_back({prev, m.start, invert});
    out.push_back({m.start, m.end, !invert});
    prev = m.end;
  }
  if (prev != len) out.push_back({prev, static_cast<uint32_t>(len), invert});
}

// Splits around `re` matches.
void split_by_regex(const Regex& re, const Split& s, SplitBehavior behavior, bool invert,
                    std::vector<Split>& out) {
  thread_local std::vector<Match> matches;
  thread_local std::vector<Segment> segments;
  const ScratchScope scratch(matches, segments);
  matches.clear();
  re.find_all(s.text, matches);
  segments_from_matches(matches, s.text.size(), invert, segments);
  split_segments(s, segments, behavior, out);
}

SplitBehavior parse_behavior(const JsonFields& j) {
  const std::string name = j.req_string("behavior");
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  throw j.error("behavior", "unknown split behavior '", name,
                "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex re, SplitBehavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Split>& splits, Arena&) const override {
    rebuild(splits, [&](const Split& s, std::vector<Split>& out) {
      split_by_regex(re_, s, behavior_, invert_, out);
    });
  }

 private:
  Regex re_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void pre_tokenize(std::vector<Split>& splits, Arena& arena) const override {
    static const Regex gpt2 = Regex::compile(kGpt2Pattern, "ByteLevel pre-tokenizer");
    rebuild(splits, [&](Split s, std::vector<Split>& out) {
      if (add_prefix_space_ && s.text.front() != ' ')
        s.text = arena.keep(" " + std::string(s.text));
      if (use_regex_) {
        split_by_regex(gpt2, s, SplitBehavior::kIsolated, false, out);
      } else {
        out.push_back(s);
      }
    });
    if (deferred_) return;
    for (Split& s : splits) {
      if (s.id >= 0) continue;
      std::string mapped;
      mapped.reserve(s.text.size() * 2);
      for (char c : s.text) mapped += byte_to_utf8()[static_cast<unsigned char>(c)];
      s.text = arena.keep(std::move(mapped));
    }
  }
  bool defer_byte_mapping() override {
    deferred_ = true;
    return true;
  }

 private:
  bool add_prefix_space_, use_regex_;
  bool deferred_ = false;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void pre_tokenize(std::vector<Split>& splits, Arena&) const override {
    thread_local std::vector<Segment> segments;
    const ScratchScope scratch(segments);
    rebuild(splits, [&](const Split& s, std::vector<Split>& out) {
      segments.clear();
      uint32_t last = 0;
      for (size_t i = 0; i < s.text.size();) {
        char32_t c;
        const size_t n = utf8_decode(s.text, i, &c);
        if (is_numeric(c)) {
          if (last < i) segments.push_back({last, static_cast<uint32_t>(i), false});
          segments.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(i + n), true});
          last = static_cast<uint32_t>(i + n);
        }
        i += n;
      }
      if (last < s.text.size())
        segments.push_back({last, static_cast<uint32_t>(s.text.size()), false});
      split_segments(s, segments,
                     individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, out);
    });
  }

 private:
  bool individual_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Split>& splits, Arena& arena) const override {
    thread_local std::vector<Segment> segments;
    const ScratchScope scratch(segments);
    rebuild(splits, [&](Split s, std::vector<Split>& out) {
      if (s.text.find(' ') != std::string_view::npos) {
        std::string replaced;
        for (char c : s.text) {
          if (c == ' ') {
            replaced += replacement_;
          } else {
            replaced.push_back(c);
          }
        }
        s.text = arena.keep(std::move(replaced));
      }
      const bool starts = s.text.substr(0, replacement_.size()) == replacement_;
      if (!starts &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && s.at_start))) {
        s.text = arena.keep(replacement_ + std::string(s.text));
      }
      if (!split_) {
        out.push_back(s);
        return;
      }
      segments.clear();
      uint32_t last = 0;
      for (size_t pos = s.text.find(replacement_); pos != std::string_view::npos;
           pos = s.text.find(replacement_, pos + replacement_.size())) {
        if (last < pos) segments.push_back({last, static_cast<uint32_t>(pos), false});
        segments.push_back(
            {static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + replacement_.size()), true});
        last = static_cast<uint32_t>(pos + replacement_.size());
      }
      if (last < s.text.size())
        segments.push_back({last, static_cast<uint32_t>(s.text.size()), false});
      split_segments(s, segments, SplitBehavior::kMergedWithNext, out);
    });
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

// Whitespace (`\w+|[^\w\s]+` kept) and WhitespaceSplit (split on White_Space, removed).
class RegexKeepPreTokenizer final : public PreTokenizer {
 public:
  explicit RegexKeepPreTokenizer(Regex re) : re_(std::move(re)) {}
  void pre_tokenize(std::vector<Split>& splits, Arena&) const override {
    rebuild(splits, [&](const Split& s, std::vector<Split>& out) {
      split_by_regex(re_, s, SplitBehavior::kRemoved, true, out);
    });
  }

 private:
  Regex re_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Split>& splits, Arena& arena) const override {
    for (const auto& p : parts_) p->pre_tokenize(splits, arena);
  }
  bool defer_byte_mapping() override {
    return !parts_.empty() && parts_.back()->defer_byte_mapping();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

void split_segments(const Split& s, const std::vector<Segment>& segments, SplitBehavior behavior,
                    std::vector<Split>& out) {
  auto emit = [&](uint32_t b, uint32_t e) {
    if (b == e) return;
    out.push_back({s.text.substr(b, e - b), -1, s.at_start && b == 0});
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Segment& g : segments) emit(g.start, g.end);
      return;
    case SplitBehavior::kRemoved:
      for (const Segment& g : segments)
        if (!g.is_match) emit(g.start, g.end);
      return;
    default:
      break;
  }
  // The merging behaviours fold segments into ranges first, as HF does.
  thread_local std::vector<std::pair<uint32_t, uint32_t>> ranges;
  const ScratchScope scratch(ranges);
  ranges.clear();
  bool previous_match = false;
  if (behavior == SplitBehavior::kMergedWithNext) {
    for (size_t k = segments.size(); k-- > 0;) {
      const Segment& g = segments[k];
      if (g.is_match && !previous_match && !ranges.empty()) {
        ranges.back().first = g.start;
      } else {
        ranges.push_back({g.start, g.end});
      }
      previous_match = g.is_match;
    }
    for (size_t k = ranges.size(); k-- > 0;) emit(ranges[k].first, ranges[k].second);
    return;
  }
  for (const Segment& g : segments) {
    const bool merge = behavior == SplitBehavior::kContiguous ? g.is_match == previous_match
                                                              : g.is_match && !previous_match;
    if (merge && !ranges.empty()) {
      ranges.back().second = g.end;
    } else {
      ranges.push_back({g.start, g.end});
    }
    previous_match = g.is_match;
  }
  for (const auto& r : ranges) emit(r.first, r.second);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonFields& j) {
  const std::string type = j.req_string("type");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const JsonList list = j.req_list("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      if (std::optional<JsonFields> part = list.opt_object(i))
        parts.push_back(make_pre_tokenizer(*part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Split") {
    const SplitBehavior behavior = parse_behavior(j);
    const bool invert = j.bool_or("invert", false);
    return std::make_unique<SplitPreTokenizer>(pattern_field(j), behavior, invert);
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(j.bool_or("add_prefix_space", true),
                                                   j.bool_or("use_regex", true));
  }
  if (type == "Digits")
    return std::make_unique<DigitsPreTokenizer>(j.bool_or("individual_digits", false));
  if (type == "Metaspace") {
    const std::string replacement = j.req_string("replacement");
    char32_t c;
    METRALE_CHECK(!replacement.empty() && utf8_valid_prefix(replacement) == replacement.size() &&
                      utf8_decode(replacement, 0, &c) == replacement.size(),
                  j.where("replacement"), ": expected one character, found '", replacement, "'");
    PrependScheme scheme = PrependScheme::kAlways;
    if (std::optional<std::string> prepend = j.opt_string("prepend_scheme")) {
      const std::string& s = *prepend;
      if (s == "first")
        scheme = PrependScheme::kFirst;
      else if (s == "never")
        scheme = PrependScheme::kNever;
      else if (s != "always")
        throw j.error("prepend_scheme", "expected always, first or never, found '", s, "'");
    }
    if (!j.bool_or("add_prefix_space", true)) {
      // As in HF, prepend_scheme defaults to "always", so it must say "never" explicitly.
      METRALE_CHECK(scheme == PrependScheme::kNever, j.where("add_prefix_space"),
                    ": false but prepend_scheme is not \"never\"");
      scheme = PrependScheme::kNever;
    }
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, j.bool_or("split", true));
  }
  if (type == "Whitespace") {
    return std::make_unique<RegexKeepPreTokenizer>(
        Regex::compile(R"(\w+|[^\w\s]+)", j.where("type")));
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<RegexKeepPreTokenizer>(Regex::compile(R"(\S+)", j.where("type")));
  }
  throw j.error(
      "type", "unsupported pre-tokenizer type '", type,
      "' (supported: Sequence, Split, ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit)");
}

}  // namespace metrale::tok
