#pragma once
// Keeps a constrained output valid UTF-8, byte by byte, whatever tokens spell it.
//
// On a byte-level vocabulary (GPT-2's byte map, SentencePiece's <0xNN> fallback) a token may
// hold part of a character, so a sequence of tokens can spell bytes that are not UTF-8.
// xgrammar 0.2.9 matches a character class over such bytes by their lead byte's length alone:
// it accepts overlong forms (C0 BC, E0 80 80), surrogates (ED A0 80) and lead bytes past
// U+10FFFF (F5..F7), which a strict decoder turns into U+FFFD each, so a string of at most N
// characters by the grammar could decode to more (and a JSON reply would not validate). The
// guard is the strict decoder's rule applied to the mask: a token is allowed only where its
// bytes continue valid UTF-8 from what the output spelled so far (RFC 3629's table).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace metrale {

// Where the output stands inside a character: `need` continuation bytes still owed, the next
// one in [lo, hi] (the second byte's range excludes the overlong forms, the surrogates and
// what lies past U+10FFFF; later ones are 80..BF).
struct Utf8State {
  uint8_t need = 0;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  bool operator==(const Utf8State&) const = default;
};

// The state after `bytes` read from `s`, or nullopt where they are not valid UTF-8 from there.
std::optional<Utf8State> utf8_step(Utf8State s, std::string_view bytes);

class Utf8Guard {
 public:
  // token_bytes[i]: the bytes token i adds to the output; empty for a token that adds none (a
  // special token, the eos, an id the tokenizer lacks), which is allowed only between
  // characters. `vocab` >= token_bytes.size(): the ids past them add none.
  Utf8Guard(const std::vector<std::string>& token_bytes, int64_t vocab);

  // The state after `token` from `s`, or nullopt where it would break the UTF-8.
  std::optional<Utf8State> after(Utf8State s, int32_t token) const;
  // Clears in `mask` (bit i of word i/32: token i) every token after() refuses from `s`.
  void restrict(Utf8State s, std::span<uint32_t> mask) const;

 private:
  std::string_view bytes_of(int32_t token) const;

  int64_t vocab_;
  std::string blob_;               // every token's bytes, back to back
  std::vector<uint32_t> offsets_;  // token i: blob_[offsets_[i], offsets_[i + 1])
  std::vector<uint32_t> between_;  // the mask of the tokens allowed between characters
};

}  // namespace metrale
