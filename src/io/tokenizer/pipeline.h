#pragma once
// Types shared by the stages of one encode: the pieces of text moving through the pipeline
// and the arena that owns any text a stage had to rewrite.
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace metrale::tok {

// One piece of the input. `text` points into the caller's input or into the Arena, so
// splitting never copies.
struct Split {
  std::string_view text;
  int32_t id = -1;        // >= 0: an added token matched here; later stages leave it alone
  bool at_start = false;  // the piece begins at original offset 0 (Metaspace "first")
};

// Owns rewritten text for the duration of one encode. A deque keeps earlier strings in place.
class Arena {
 public:
  std::string_view keep(std::string s) { return strings_.emplace_back(std::move(s)); }
  void clear() { strings_.clear(); }

 private:
  std::deque<std::string> strings_;
};

// The stages' thread-local scratch keeps its capacity from call to call (no allocation per
// word), but not past kScratchKeepBytes: every connection thread of a server encodes with its
// own, so what one long input grew would otherwise stay held by each thread it ran on
// (hundreds of MiB for a few MiB of text on each of --http-threads threads).
inline constexpr size_t kScratchKeepBytes = size_t{64} << 10;

template <typename T>
void release_scratch(std::vector<T>& v) {
  if (v.capacity() * sizeof(T) > kScratchKeepBytes) std::vector<T>().swap(v);
}
inline void release_scratch(std::string& s) {
  if (s.capacity() > kScratchKeepBytes) std::string().swap(s);
}
// An arena's strings are the text of the encode that used it: given back when it ends.
inline void release_scratch(Arena& a) { a.clear(); }

// Releases its scratch (release_scratch) when the scope ends, however it ends.
template <typename... Scratch>
class ScratchScope {
 public:
  explicit ScratchScope(Scratch&... scratch) : scratch_(scratch...) {}
  ~ScratchScope() {
    std::apply([](auto&... s) { (release_scratch(s), ...); }, scratch_);
  }
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

 private:
  std::tuple<Scratch&...> scratch_;
};

}  // namespace metrale::tok
