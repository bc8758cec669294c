#pragma once
// Marconi's floor (Pan et al. 2025, "Marconi: Prefix Caching for the Era of Hybrid LLMs"): a
// hybrid model's recurrent state is resumed from a prefix-cache snapshot only for a match at
// least this many tokens deep — a shorter match saves less prefill than the snapshot costs to
// keep. One process-wide value, shared by the prefix cache's snapshot admission
// (serve/prefix_cache) and the MTP carry of hybrid targets (whose target state comes from those
// snapshots), so the two never disagree. `serve --marconi-min-tokens` sets it.
//
// It lives here, below serve/ and engine/, because both of its readers must see the same value.
#include <cstdint>

namespace metrale {

inline constexpr int64_t DEFAULT_MARCONI_MIN_TOKENS = 256;

// Sets the floor once per process (0 removes it), before any reader pinned it. Throws on a
// negative value, a second call, or a call after pin_marconi_min_tokens().
void set_marconi_min_tokens(int64_t tokens);
int64_t marconi_min_tokens();

// A reader whose decisions must not change under it (a PrefixCache when it is made) pins the
// value: a later set_marconi_min_tokens() is an error naming `who` (a string literal).
void pin_marconi_min_tokens(const char* who);

}  // namespace metrale
