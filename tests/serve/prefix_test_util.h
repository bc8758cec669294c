#pragma once
// What the prefix-cache tests (dense and hybrid executables) share: random prompts and one
// greedy run of a prompt through the cache (or without it) to compare against.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "serve/prefix_cache.h"

namespace metrale::serve_test {

// n ids drawn uniformly from [3, hi] (seeded).
inline std::vector<int32_t> random_ids(size_t n, uint32_t seed, int32_t hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, hi);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = id(rng);
  return out;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// What a request produces: the logits after its prompt and after each greedy token.
struct Output {
  int64_t cached = 0;  // prompt tokens the cache supplied
  std::vector<float> logits;
  std::vector<int32_t> tokens;
};

struct RunOptions {
  std::string adapter;         // LoRA adapter of the sequence ("" = base)
  std::vector<int64_t> stops;  // prefill chunks end here and the cache records (insert)
  bool insert_at_end = true;   // insert() once the greedy tokens are done
};

// The prompt (attach() first when `cache` is given; prefill chunks ending at o.stops, as the
// scheduler ends them at snapshot points), then `n_new` greedy tokens, in one sequence
// released at the end.
inline Output generate(Model& m, PrefixCache* cache, const std::vector<int32_t>& prompt, int n_new,
                       const RunOptions& o) {
  const auto V = static_cast<size_t>(m.vocab_size());
  Output r;
  Sequence s;
  if (!o.adapter.empty()) m.set_adapter(s, o.adapter);
  if (cache != nullptr) r.cached = cache->attach(s, prompt);
  EXPECT_EQ(static_cast<int64_t>(s.tokens.size()), r.cached);
  std::vector<float> out(V);
  int64_t at = r.cached;
  for (int64_t stop : o.stops) {
    if (stop <= at || stop >= static_cast<int64_t>(prompt.size())) continue;
    m.prefill(s, std::span(prompt).subspan(static_cast<size_t>(at), static_cast<size_t>(stop - at)),
              out);
    if (cache != nullptr) cache->insert(s);
    at = stop;
  }
  m.prefill(s, std::span(prompt).subspan(static_cast<size_t>(at)), out);
  for (int i = 0;; ++i) {
    r.logits.insert(r.logits.end(), out.begin(), out.end());
    if (i == n_new) break;
    r.tokens.push_back(argmax(out));
    Sequence* p = &s;
    m.decode({&p, 1}, {&r.tokens.back(), 1}, out);
  }
  if (cache != nullptr && o.insert_at_end) cache->insert(s);
  m.release(s);
  return r;
}

}  // namespace metrale::serve_test
