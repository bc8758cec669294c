#pragma once
// The Marconi floor of this executable's tests (speculative/marconi.h): set once per process,
// before any test makes a prefix cache, to 32 tokens (the default of 256 would leave nothing
// to test in the fixtures' context of 256).
#include <cstdint>

#include "speculative/marconi.h"

namespace metrale::serve_test {

inline constexpr int64_t kHybridFloor = 32;

inline void use_hybrid_test_floor() {
  static const bool once = (set_marconi_min_tokens(kHybridFloor), true);
  (void)once;
}

}  // namespace metrale::serve_test
