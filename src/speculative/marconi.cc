#include "speculative/marconi.h"

#include <atomic>

#include "core/error.h"

namespace metrale {
namespace {

std::atomic<int64_t> g_min_tokens{DEFAULT_MARCONI_MIN_TOKENS};
std::atomic<bool> g_set{false};
std::atomic<const char*> g_pinned_by{nullptr};

}  // namespace

void set_marconi_min_tokens(int64_t tokens) {
  METRALE_CHECK(tokens >= 0, "marconi min tokens: expected >= 0, found ", tokens);
  METRALE_CHECK(!g_set.load(), "marconi min tokens: already set (to ", g_min_tokens.load(),
                "); it is set once per process");
  const char* who = g_pinned_by.load();
  METRALE_CHECK(who == nullptr, "marconi min tokens: already in use by ", who, " (with ",
                g_min_tokens.load(), "); set it before that");
  METRALE_CHECK(!g_set.exchange(true), "marconi min tokens: already set (to ", g_min_tokens.load(),
                "); it is set once per process");
  g_min_tokens.store(tokens);
}

int64_t marconi_min_tokens() { return g_min_tokens.load(); }

void pin_marconi_min_tokens(const char* who) {
  const char* expected = nullptr;
  g_pinned_by.compare_exchange_strong(expected, who);  // the first reader is the one named
}

}  // namespace metrale
