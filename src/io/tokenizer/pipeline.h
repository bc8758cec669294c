#pragma once
// Types shared by the stages of one encode: the pieces of text moving through the pipeline
// and the arena that owns any text a stage had to rewrite.
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

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

}  // namespace metrale::tok
