#include "speculative/ngram_proposer.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace metrale::speculative {
namespace {

constexpr uint64_t kBase = 0x100000001b3ULL;  // odd: a polynomial hash mod 2^64

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One sequence's context and its n-gram index (see the header).
struct NgramState final : ProposerState {
  NgramState(int64_t lo, int64_t hi) : min_n(lo), max_n(hi), width(hi - lo + 1) {
    pow.resize(static_cast<size_t>(hi) + 1);
    pow[0] = 1;
    for (size_t i = 1; i < pow.size(); ++i) pow[i] = pow[i - 1] * kBase;
  }

  const int64_t min_n, max_n, width;
  std::vector<int32_t> tokens;
  std::vector<uint64_t> prefix{0};  // prefix[i]: the hash of tokens[0, i)
  std::vector<uint64_t> pow;        // kBase^i, i <= max_n
  // Ends 0 .. indexed - 1 are in the tables; the last token is never indexed (a suffix must
  // not match itself), so indexed <= tokens.size() - 1.
  int64_t indexed = 0;
  std::unordered_map<uint64_t, int32_t> latest;  // (n, hash) -> the most recent end
  std::vector<int32_t> prev;     // [end * width + n - min_n]: the previous end of that key, or -1
  std::vector<int32_t> pending;  // the last propose()'s drafts

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }

  // The table key of the n tokens ending at `end`.
  uint64_t key(int64_t end, int64_t n) const {
    const uint64_t h = prefix[static_cast<size_t>(end + 1)] -
                       prefix[static_cast<size_t>(end + 1 - n)] * pow[static_cast<size_t>(n)];
    return mix(h ^ (static_cast<uint64_t>(n) * 0x9e3779b97f4a7c15ULL));
  }

  void push(int32_t t) {
    tokens.push_back(t);
    prefix.push_back(prefix.back() * kBase + static_cast<uint64_t>(t) + 1);
  }

  void index_through(int64_t last_end) {
    for (; indexed <= last_end; ++indexed) {
      const int64_t e = indexed;
      prev.resize(static_cast<size_t>((e + 1) * width), -1);
      for (int64_t n = min_n; n <= std::min(max_n, e + 1); ++n) {
        auto [it, inserted] = latest.try_emplace(key(e, n), static_cast<int32_t>(e));
        if (!inserted) {
          prev[static_cast<size_t>(e * width + n - min_n)] = it->second;
          it->second = static_cast<int32_t>(e);
        }
      }
    }
  }

  // Drops tokens from `len` on, unlinking their ends newest first (the exact inverse of
  // index_through).
  void truncate(int64_t len) {
    if (len >= size()) return;
    const int64_t keep = std::max<int64_t>(len - 1, 0);
    for (; indexed > keep; --indexed) {
      const int64_t e = indexed - 1;
      for (int64_t n = min_n; n <= std::min(max_n, e + 1); ++n) {
        const auto it = latest.find(key(e, n));
        METRALE_DCHECK(it != latest.end() && it->second == e);
        const int32_t p = prev[static_cast<size_t>(e * width + n - min_n)];
        if (p < 0) {
          latest.erase(it);
        } else {
          it->second = p;
        }
      }
      prev.resize(static_cast<size_t>(e * width));
    }
    tokens.resize(static_cast<size_t>(len));
    prefix.resize(static_cast<size_t>(len) + 1);
  }

  bool same(int64_t end_a, int64_t end_b, int64_t n) const {
    return std::equal(tokens.begin() + end_a - n + 1, tokens.begin() + end_a + 1,
                      tokens.begin() + end_b - n + 1);
  }

  // Up to `limit` ends of earlier occurrences of the context's suffix: every n from max_n
  // down to min_n, the most recent first within each, an end listed once. The first is match().
  std::vector<int64_t> matches(int64_t limit) {
    const int64_t last = size() - 1;
    index_through(last - 1);
    std::vector<int64_t> ends;
    for (int64_t n = std::min(max_n, last); n >= min_n; --n) {
      const auto it = latest.find(key(last, n));
      if (it == latest.end()) continue;
      for (int64_t e = it->second; e >= 0; e = prev[static_cast<size_t>(e * width + n - min_n)]) {
        if (static_cast<int64_t>(ends.size()) >= limit) return ends;
        if (same(e, last, n) && std::find(ends.begin(), ends.end(), e) == ends.end())
          ends.push_back(e);
      }
    }
    return ends;
  }

  // The longest suffix (min_n..max_n) with an earlier occurrence, the most recent one: the
  // end of that occurrence, or -1.
  int64_t match() {
    const int64_t last = size() - 1;
    index_through(last - 1);
    for (int64_t n = std::min(max_n, last); n >= min_n; --n) {
      const auto it = latest.find(key(last, n));
      if (it == latest.end()) continue;
      for (int64_t e = it->second; e >= 0; e = prev[static_cast<size_t>(e * width + n - min_n)]) {
        if (same(e, last, n)) return e;
      }
    }
    return -1;
  }
};

NgramState& ngram_state(ProposerState& s) { return static_cast<NgramState&>(s); }

}  // namespace

NgramProposer::NgramProposer(const NgramOptions& o) : options_(o) {
  METRALE_CHECK(o.min_n >= 1 && o.min_n <= kNgramMaxN, "ngram proposer: min_n: expected 1..",
                kNgramMaxN, ", found ", o.min_n);
  METRALE_CHECK(o.max_n >= o.min_n && o.max_n <= kNgramMaxN, "ngram proposer: max_n: expected ",
                o.min_n, "..", kNgramMaxN, " (min_n..", kNgramMaxN, "), found ", o.max_n);
}

std::span<const int32_t> NgramProposer::context(const ProposerState& state) {
  const auto* s = dynamic_cast<const NgramState*>(&state);
  METRALE_CHECK(s != nullptr, "ngram proposer: not an n-gram proposer's state");
  return s->tokens;
}

std::unique_ptr<ProposerState> NgramProposer::do_alloc_state() {
  return std::make_unique<NgramState>(options_.min_n, options_.max_n);
}

void NgramProposer::do_prefill(ProposerState& state, std::span<const int32_t> prompt, ConstRows) {
  NgramState& s = ngram_state(state);
  s.tokens.reserve(prompt.size());
  for (int32_t t : prompt) s.push(t);
}

void NgramProposer::do_propose(const ProposeArgs& a, std::vector<int32_t>& drafts) {
  NgramState& s = ngram_state(*a.state);
  s.truncate(a.position);
  s.push(a.last);
  s.pending.clear();
  if (a.n == 0) return;
  const int64_t e = s.match();
  if (e < 0) return;
  const int64_t end = std::min(e + a.n, s.size() - 1);
  drafts.assign(s.tokens.begin() + e + 1, s.tokens.begin() + end + 1);
  s.pending = drafts;
}

void NgramProposer::do_propose_tree_batch(std::span<const ProposeArgs> args, const DraftTree& shape,
                                          std::span<TreeDrafts> out) {
  struct TrieNode {
    int32_t token = -1;
    std::vector<int64_t> children;  // in the order first met
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const ProposeArgs& a = args[i];
    NgramState& s = ngram_state(*a.state);
    s.truncate(a.position);
    s.push(a.last);
    s.pending.clear();
    const int64_t depth = std::min(a.n, shape.max_depth());
    if (depth == 0) continue;
    // The trie of what followed each occurrence (up to `depth` tokens, inside the context).
    std::vector<TrieNode> trie(1);
    for (const int64_t e : s.matches(kNgramTreeOccurrences)) {
      int64_t at = 0;
      for (int64_t t = e + 1; t <= std::min(e + depth, s.size() - 1); ++t) {
        const int32_t tok = s.tokens[static_cast<size_t>(t)];
        int64_t next = -1;
        for (const int64_t c : trie[static_cast<size_t>(at)].children) {
          if (trie[static_cast<size_t>(c)].token == tok) next = c;
        }
        if (next < 0) {
          next = static_cast<int64_t>(trie.size());
          trie[static_cast<size_t>(at)].children.push_back(next);
          trie.push_back({.token = tok});
        }
        at = next;
      }
    }
    fill_tree(
        shape, depth, 0,
        [&](int64_t node, int64_t rank) {
          const std::vector<int64_t>& c = trie[static_cast<size_t>(node)].children;
          if (rank >= static_cast<int64_t>(c.size())) return TreeGuess{};
          const int64_t child = c[static_cast<size_t>(rank)];
          return TreeGuess{.token = trie[static_cast<size_t>(child)].token, .handle = child};
        },
        out[i]);
    for (const int64_t k : out[i].main_chain())
      s.pending.push_back(out[i].tokens[static_cast<size_t>(k)]);
  }
}

void NgramProposer::do_after_verify(ProposerState& state, int64_t /*drafted*/, int64_t accepted) {
  NgramState& s = ngram_state(state);
  for (int64_t i = 0; i < accepted; ++i) s.push(s.pending[static_cast<size_t>(i)]);
  s.pending.clear();
}

void NgramProposer::do_catchup(ProposerState& state, const CatchupRows& rows) {
  NgramState& s = ngram_state(state);
  s.truncate(rows.first_key + 1);
  for (int32_t t : rows.ids) s.push(t);
}

}  // namespace metrale::speculative
