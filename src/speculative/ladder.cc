#include "speculative/ladder.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <numeric>
#include <string>

#include "core/error.h"

namespace metrale::speculative {
namespace {

// A non-negative decimal integer spanning all of `s`, or -1.
int64_t parse_count(std::string_view s) {
  if (s.empty() || s.size() > 18) return -1;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.front() == '-' || s.front() == '+') {
    return -1;
  }
  return v;
}

void check_num_drafts(int64_t num_drafts, std::string_view flag) {
  METRALE_CHECK(num_drafts >= 1 && num_drafts <= kMaxDispatchCap, flag,
                ": the draft count must be in 1..", kMaxDispatchCap, ", found ", num_drafts);
}

}  // namespace

DraftLadder DraftLadder::constant(int64_t num_drafts) {
  check_num_drafts(num_drafts, "draft ladder");
  DraftLadder l;
  l.num_drafts_ = num_drafts;
  l.rungs_.push_back({.n_max = INT64_MAX, .drafts = num_drafts});
  return l;
}

DraftLadder DraftLadder::parse(std::string_view spec, int64_t num_drafts, std::string_view flag) {
  check_num_drafts(num_drafts, flag);
  METRALE_CHECK(!spec.empty(), flag, ": empty ladder; expected rungs n_max:drafts, e.g. ",
                "\"4:3,8:3,16:1,32:1\"");
  DraftLadder l;
  l.num_drafts_ = num_drafts;
  size_t start = 0;
  for (int64_t index = 1;; ++index) {
    const size_t comma = spec.find(',', start);
    const std::string_view rung = spec.substr(start, comma - start);
    const auto fail = [&](auto&&... what) {
      return make_error(flag, ": rung ", index, " '", rung, "': ", what...);
    };
    const size_t colon = rung.find(':');
    if (colon == std::string_view::npos) throw fail("expected n_max:drafts");
    const std::string_view n_text = rung.substr(0, colon);
    const std::string_view d_text = rung.substr(colon + 1);
    const int64_t n_max = parse_count(n_text);
    if (n_max < 1) throw fail("n_max: expected a positive integer, found '", n_text, "'");
    const int64_t drafts = parse_count(d_text);
    if (drafts < 0) throw fail("drafts: expected a non-negative integer, found '", d_text, "'");
    if (!l.rungs_.empty() && n_max <= l.rungs_.back().n_max) {
      throw fail("n_max ", n_max, " must be above the previous rung's ", l.rungs_.back().n_max);
    }
    // 0 stays 0 (no drafts at this width); any other count is clamped to 1..num_drafts.
    l.rungs_.push_back({.n_max = n_max, .drafts = std::min(drafts, num_drafts)});
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return l;
}

int64_t DraftLadder::drafts_for(int64_t active) const {
  METRALE_DCHECK(!rungs_.empty());
  for (const LadderRung& r : rungs_) {
    if (active <= r.n_max) return r.drafts;
  }
  return rungs_.back().drafts;
}

void check_dispatch_cap(int64_t cap, int64_t num_drafts, std::string_view cap_flag,
                        std::string_view drafts_flag) {
  METRALE_CHECK(cap >= 1 && cap <= kMaxDispatchCap, cap_flag, ": expected 1..", kMaxDispatchCap,
                ", found ", cap);
  METRALE_CHECK(num_drafts >= 1 && num_drafts <= cap, drafts_flag, ": ", num_drafts,
                " drafts per step is outside 1..", cap, " (", cap_flag, ")");
}

void fit_dispatch_cap(std::span<int64_t> drafts, int64_t cap) {
  METRALE_CHECK(cap >= 0, "dispatch cap: expected >= 0, found ", cap);
  for (int64_t& d : drafts) d = std::max<int64_t>(d, 0);
  const int64_t total = std::accumulate(drafts.begin(), drafts.end(), int64_t{0});
  if (total <= cap) return;
  // The highest level L with sum(min(d, L)) <= cap: binary search over 0..max(d).
  const auto fill = [&](int64_t level) {
    int64_t s = 0;
    for (int64_t d : drafts) s += std::min(d, level);
    return s;
  };
  int64_t lo = 0;
  int64_t hi = *std::max_element(drafts.begin(), drafts.end());
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fill(mid) <= cap) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  int64_t left = cap - fill(lo);
  for (int64_t& d : drafts) {
    const int64_t share = std::min(d, lo);
    const bool extra = d > lo && left > 0;
    d = share + (extra ? 1 : 0);
    if (extra) --left;
  }
}

}  // namespace metrale::speculative
