#include "io/tokenizer/bpe_model.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "io/tokenizer/pipeline.h"
#include "io/tokenizer/utf8.h"

namespace metrale::tok {

namespace {

// Ids beyond this would make the id -> token table absurdly large; real vocabularies stay
// far below it.
constexpr int64_t kMaxId = int64_t{1} << 24;

struct HeapEntry {
  uint32_t rank;
  int32_t pos;
  int32_t id;
};
// std::*_heap keeps the largest on top; "largest" here is the smallest (rank, pos).
bool heap_less(const HeapEntry& a, const HeapEntry& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

void PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, Value{});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  size_ = 0;
}

void PairMap::insert_or_assign(int32_t a, int32_t b, Value v) {
  const uint64_t key = pack(a, b);
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    if (keys_[i] == key) {
      values_[i] = v;  // a repeated pair keeps its last rank, as HF's map collect does
      return;
    }
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      values_[i] = v;
      ++size_;
      return;
    }
  }
}

std::unique_ptr<BpeModel> BpeModel::from_json(const JsonFields& j) {
  auto m = std::unique_ptr<BpeModel>(new BpeModel());
  if (std::optional<double> dropout = j.opt_number("dropout"); dropout && *dropout != 0.0) {
    throw j.error("dropout", "BPE dropout is not supported (expected null), found ", *dropout);
  }
  m->unk_token_ = j.opt_string("unk_token");
  m->prefix_ = j.opt_string("continuing_subword_prefix");
  m->suffix_ = j.opt_string("end_of_word_suffix");
  m->fuse_unk_ = j.bool_or("fuse_unk", false);
  m->byte_fallback_ = j.bool_or("byte_fallback", false);
  m->ignore_merges_ = j.bool_or("ignore_merges", false);

  const JsonFields vocab = j.req_object("vocab");
  m->vocab_.reserve(vocab.object().size());
  int64_t max_id = -1;
  for (auto it = vocab.object().begin(); it != vocab.object().end(); ++it) {
    const nlohmann::json& v = it.value();  // read in place: a real vocabulary has 150k entries
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxId) {
      throw vocab.error(it.key(), "expected an id in [0, ", kMaxId, "), found ",
                        describe_json_value(v));
    }
    const auto id = v.get<int64_t>();
    m->vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  m->has_id_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : m->vocab_) {
    m->id_to_token_[static_cast<size_t>(id)] = token;
    m->has_id_[static_cast<size_t>(id)] = true;
  }
  if (m->unk_token_) m->unk_id_ = m->token_to_id(*m->unk_token_);

  const JsonList merges = j.req_list("merges");
  m->merges_.reserve(merges.size());
  const size_t prefix_len = m->prefix_ ? m->prefix_->size() : 0;
  uint32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const nlohmann::json& e = merges[i];
    const std::string at = merges.where(i);
    std::string a, b;
    if (e.is_string()) {
      const std::string line = e.get<std::string>();
      if (line.rfind("#version", 0) == 0) continue;  // merges.txt header, skipped as HF does
      const size_t sp = line.find(' ');
      METRALE_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos, at,
                    ": expected \"left right\" (exactly one space), found \"", line, "\"");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else {
      METRALE_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), at,
                    ": expected a \"left right\" string or a [left, right] pair, found ",
                    describe_json_value(e));
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    auto id_of = [&](const std::string& t) {
      auto id = m->token_to_id(t);
      METRALE_CHECK(id.has_value(), at, ": token '", t, "' is not in the vocabulary");
      return *id;
    };
    METRALE_CHECK(b.size() >= prefix_len, at, ": right token '", b,
                  "' is shorter than continuing_subword_prefix");
    const int32_t left = id_of(a), right = id_of(b);
    const int32_t merged = id_of(a + b.substr(prefix_len));
    m->merges_.insert_or_assign(left, right, {rank++, merged});
  }

  for (size_t b = 0; b < 256; ++b) {
    static const char* kHex = "0123456789ABCDEF";
    const std::string code = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    m->byte_fallback_ids_[b] = m->token_to_id(code).value_or(-1);
    for (size_t kind = 0; kind < 4; ++kind) {
      const bool first = (kind & 1) == 0, last = (kind & 2) != 0;
      std::string s = (!first && m->prefix_ ? *m->prefix_ : "") + byte_to_utf8()[b] +
                      (last && m->suffix_ ? *m->suffix_ : "");
      m->byte_ids_[kind][b] = m->token_to_id(s).value_or(-1);
    }
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[static_cast<size_t>(id)])
    return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

namespace {

template <typename Sym>
void push_symbol(std::vector<Sym>& syms, int32_t id, uint32_t len) {
  const auto n = static_cast<int32_t>(syms.size());
  if (n > 0) syms.back().next = n;
  syms.push_back({id, n - 1, -1, len});
}

}  // namespace

void BpeModel::add_char_slow(std::string_view s, uint32_t byte_len, std::vector<Symbol>& syms,
                             std::optional<std::pair<int32_t, uint32_t>>& unk) const {
  if (auto it = vocab_.find(s); it != vocab_.end()) {
    if (unk) {
      push_symbol(syms, unk->first, unk->second);
      unk.reset();
    }
    push_symbol(syms, it->second, byte_len);
    return;
  }
  if (byte_fallback_) {
    bool all = true;
    for (char c : s) all = all && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
    if (all) {
      // HF emits the byte tokens without first flushing a pending unk; kept for equality.
      for (char c : s) push_symbol(syms, byte_fallback_ids_[static_cast<unsigned char>(c)], 1);
      return;
    }
  }
  if (!unk_token_) return;  // no unk token: HF silently drops the character
  METRALE_CHECK(unk_id_.has_value(), "BPE model: unk_token '", *unk_token_,
                "' is not in the vocabulary");
  if (unk && fuse_unk_) {
    unk->second += byte_len;
    return;
  }
  if (unk) push_symbol(syms, unk->first, unk->second);
  unk = std::make_pair(*unk_id_, byte_len);
}

void BpeModel::merge_all(std::vector<Symbol>& syms) const {
  thread_local std::vector<HeapEntry> heap;
  const ScratchScope scratch(heap);
  heap.clear();
  const auto n = static_cast<int32_t>(syms.size());
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const PairMap::Value* m = merges_.find(syms[i].id, syms[i + 1].id))
      heap.push_back({m->rank, i, m->id});
  }
  std::make_heap(heap.begin(), heap.end(), heap_less);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), heap_less);
    const HeapEntry top = heap.back();
    heap.pop_back();
    Symbol& cur = syms[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = syms[next_pos];
    // An entry is stale when the pair at its position no longer merges into its id.
    const PairMap::Value* m = merges_.find(cur.id, right.id);
    if (m == nullptr || m->id != top.id) continue;
    cur.id = top.id;
    cur.len += right.len;
    cur.next = right.next;
    syms[next_pos].len = 0;
    if (right.next > -1 && right.next < n) syms[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const PairMap::Value* p = merges_.find(syms[cur.prev].id, cur.id)) {
        heap.push_back({p->rank, cur.prev, p->id});
        std::push_heap(heap.begin(), heap.end(), heap_less);
      }
    }
    if (cur.next > -1 && cur.next < n) {
      if (const PairMap::Value* p = merges_.find(cur.id, syms[cur.next].id)) {
        heap.push_back({p->rank, top.pos, p->id});
        std::push_heap(heap.begin(), heap.end(), heap_less);
      }
    }
  }
}

void BpeModel::merge_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> syms;
  thread_local std::string tmp;
  const ScratchScope scratch(syms, tmp);
  syms.clear();
  std::optional<std::pair<int32_t, uint32_t>> unk;
  const bool affixes = prefix_.has_value() || suffix_.has_value();
  auto affixed = [&](std::string_view c, bool first, bool last) -> std::string_view {
    if (!affixes) return c;
    tmp.clear();
    if (!first && prefix_) tmp += *prefix_;
    tmp += c;
    if (last && suffix_) tmp += *suffix_;
    return tmp;
  };
  if (byte_level) {
    for (size_t i = 0; i < word.size(); ++i) {
      const auto b = static_cast<unsigned char>(word[i]);
      const bool first = i == 0, last = i + 1 == word.size();
      const int32_t id = byte_ids_[(first ? 0 : 1) + (last ? 2 : 0)][b];
      if (id >= 0) {
        if (unk) {
          push_symbol(syms, unk->first, unk->second);
          unk.reset();
        }
        push_symbol(syms, id, 1);
      } else {
        add_char_slow(affixed(byte_to_utf8()[b], first, last), 1, syms, unk);
      }
    }
  } else {
    for (size_t i = 0; i < word.size();) {
      const size_t n = utf8_len(static_cast<unsigned char>(word[i]));
      add_char_slow(affixed(word.substr(i, n), i == 0, i + n == word.size()),
                    static_cast<uint32_t>(n), syms, unk);
      i += n;
    }
  }
  if (unk) push_symbol(syms, unk->first, unk->second);
  merge_all(syms);
  for (const Symbol& s : syms)
    if (s.len != 0) out.push_back(s.id);
}

void BpeModel::tokenize(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    std::string mapped;
    if (byte_level) {
      for (char c : word) mapped += byte_to_utf8()[static_cast<unsigned char>(c)];
    }
    if (auto id = token_to_id(byte_level ? std::string_view(mapped) : word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWord;
  if (cacheable) {
    std::unique_lock<std::mutex> lock(cache_mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      if (auto it = cache_.find(word); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
  }
  const size_t begin = out.size();
  merge_word(word, byte_level, out);
  if (cacheable) {
    std::unique_lock<std::mutex> lock(cache_mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      // Full: start over rather than stop caching, so a long-running process keeps adapting.
      if (cache_.size() >= kCacheCapacity) cache_.clear();
      cache_.emplace(
          std::string(word),
          std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(begin), out.end()));
    }
  }
}

}  // namespace metrale::tok
