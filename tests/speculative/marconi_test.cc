// Marconi's floor: 256 by default, set once per process, never after a reader pinned it. Each
// case runs in a child process (a death test exiting 0 on success), so this executable's own
// floor is never set.
#include "speculative/marconi.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace metrale {
namespace {

// The message set_marconi_min_tokens(v) throws ("" when it does not).
std::string set_error(int64_t v) {
  try {
    set_marconi_min_tokens(v);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

TEST(MarconiFloorDeathTest, DefaultsTo256AndIsSetOnce) {
  EXPECT_EQ(DEFAULT_MARCONI_MIN_TOKENS, 256);
  EXPECT_EXIT(
      {
        const bool ok = marconi_min_tokens() == 256 &&
                        has(set_error(-1), "expected >= 0, found -1") &&  // refused: not used up
                        set_error(100).empty() && marconi_min_tokens() == 100 &&
                        has(set_error(64), "already set (to 100); it is set once per process") &&
                        marconi_min_tokens() == 100;
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(MarconiFloorDeathTest, ASetAfterAReaderPinnedItIsAnError) {
  EXPECT_EXIT(
      {
        pin_marconi_min_tokens("a prefix cache");
        pin_marconi_min_tokens("an mtp carry");  // the first reader stays the one named
        const bool ok =
            has(set_error(32), "already in use by a prefix cache (with 256); set it before that") &&
            marconi_min_tokens() == 256;
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(MarconiFloorDeathTest, ZeroRemovesTheFloor) {
  EXPECT_EXIT(
      {
        set_marconi_min_tokens(0);
        pin_marconi_min_tokens("a prefix cache");
        std::exit(marconi_min_tokens() == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace metrale
