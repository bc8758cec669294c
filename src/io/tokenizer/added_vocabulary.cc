#include "io/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "io/tokenizer/utf8.h"

namespace metrale::tok {

namespace {

char32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  char32_t c;
  utf8_decode(s, i, &c);
  return c;
}

// Start of the run of White_Space at the end of `s` (HF: the `\s*$` match).
size_t trailing_space_start(std::string_view s) {
  size_t e = s.size();
  while (e > 0) {
    size_t i = e - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    char32_t c;
    utf8_decode(s, i, &c);
    if (!is_white_space(c)) break;
    e = i;
  }
  return e;
}

// Length of the run of White_Space at the start of `s` (HF: the `^\s*` match).
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t c;
    const size_t n = utf8_decode(s, i, &c);
    if (!is_white_space(c)) break;
    i += n;
  }
  return i;
}

}  // namespace

void AddedVocabulary::Matcher::build(const std::string& where) {
  for (auto& b : by_first_byte) b.clear();
  std::sort(patterns.begin(), patterns.end());
  for (size_t i = 1; i < patterns.size(); ++i) {
    METRALE_CHECK(patterns[i].first != patterns[i - 1].first, where, ": added tokens ",
                  patterns[i - 1].second, " and ", patterns[i].second, " both match the text '",
                  patterns[i].first, "'");
  }
  for (uint32_t i = 0; i < patterns.size(); ++i) {
    by_first_byte[static_cast<unsigned char>(patterns[i].first[0])].push_back(i);
  }
  for (auto& b : by_first_byte) {
    std::stable_sort(b.begin(), b.end(), [&](uint32_t x, uint32_t y) {
      return patterns[x].first.size() > patterns[y].first.size();
    });
  }
  any = !patterns.empty();
}

void AddedVocabulary::load(const JsonList& list, const BpeModel& model,
                           const Normalizer* normalizer) {
  int64_t next_id = static_cast<int64_t>(model.vocab_size());
  for (size_t i = 0; i < list.size(); ++i) {
    const JsonFields j = list.object(i);
    AddedToken t;
    t.content = j.req_string("content");
    if (utf8_valid_prefix(t.content) != t.content.size())
      throw j.error("content", "not valid UTF-8");
    t.single_word = j.bool_or("single_word", false);
    t.lstrip = j.bool_or("lstrip", false);
    t.rstrip = j.bool_or("rstrip", false);
    t.normalized = j.bool_or("normalized", true);
    t.special = j.bool_or("special", false);
    if (t.content.empty()) continue;
    if (auto it = by_content_.find(t.content); it != by_content_.end()) {
      const AddedToken& old = tokens_[by_id_.at(it->second)];
      if (old.single_word == t.single_word && old.lstrip == t.lstrip && old.rstrip == t.rstrip &&
          old.normalized == t.normalized && old.special == t.special)
        continue;
    }
    if (auto known = token_to_id(t.content)) {
      t.id = *known;
    } else if (auto in_model = model.token_to_id(t.content)) {
      t.id = *in_model;
    } else {
      t.id = static_cast<int32_t>(next_id++);
    }
    Arena arena;
    t.normalized_content = t.normalized && normalizer
                               ? std::string(normalizer->normalize(t.content, arena))
                               : t.content;
    by_content_[t.content] = t.id;
    if (t.special) special_.insert(t.content);
    if (auto it = by_id_.find(t.id); it != by_id_.end()) {
      tokens_[it->second] = t;
    } else {
      by_id_[t.id] = tokens_.size();
      tokens_.push_back(t);
    }
    // HF recomputes its next id from the largest added id after each call; one call here.
  }
  rebuild_matchers(list.where());
}

void AddedVocabulary::rebuild_matchers(const std::string& where) {
  plain_.patterns.clear();
  normalized_.patterns.clear();
  for (const AddedToken& t : tokens_) {
    if (t.normalized) {
      if (!t.normalized_content.empty())
        normalized_.patterns.emplace_back(t.normalized_content, t.id);
    } else {
      plain_.patterns.emplace_back(t.content, t.id);
    }
  }
  plain_.build(where);
  normalized_.build(where);
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const std::string* AddedVocabulary::id_to_token(int32_t id) const {
  const AddedToken* t = by_id(id);
  return t ? &t->normalized_content : nullptr;
}

void AddedVocabulary::split(const Split& s, bool normalized_set, std::vector<Split>& out) const {
  const Matcher& m = normalized_set ? normalized_ : plain_;
  const std::string_view text = s.text;
  if (!m.any) {
    out.push_back(s);
    return;
  }
  size_t start_offset = 0;
  auto emit = [&](size_t b, size_t e, int32_t id) {
    if (b >= e) return;
    out.push_back({text.substr(b, e - b), id, s.at_start && b == 0});
  };
  // Leftmost-longest, non-overlapping scan; a rejected match (single_word) still consumes
  // its span, as HF's Aho-Corasick iterator does.
  size_t i = 0;
  while (i < text.size()) {
    const auto& cands = m.by_first_byte[static_cast<unsigned char>(text[i])];
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (uint32_t k : cands) {
      const auto& p = m.patterns[k];
      if (text.compare(i, p.first.size(), p.first) == 0) {
        hit = &p;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->first.size();
    i = stop;
    const AddedToken& t = *by_id(hit->second);
    if (t.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      char32_t next = 0;
      if (stop < text.size()) utf8_decode(text, stop, &next);
      const bool stop_space = stop == text.size() || !is_word_char(next);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (t.rstrip) stop += leading_space_len(text.substr(stop));
    if (start_offset < start) emit(start_offset, start, -1);
    out.push_back({text.substr(start, stop - start), t.id, s.at_start && start == 0});
    start_offset = stop;
  }
  if (start_offset < text.size()) emit(start_offset, text.size(), -1);
}

}  // namespace metrale::tok
