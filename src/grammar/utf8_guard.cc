#include "grammar/utf8_guard.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "core/error.h"

namespace metrale {

std::optional<Utf8State> utf8_step(Utf8State s, std::string_view bytes) {
  for (const char ch : bytes) {
    const auto b = static_cast<uint8_t>(ch);
    if (s.need > 0) {
      if (b < s.lo || b > s.hi) return std::nullopt;
      s = {static_cast<uint8_t>(s.need - 1), 0x80, 0xBF};
      continue;
    }
    if (b < 0x80) continue;
    if (b >= 0xC2 && b <= 0xDF) {
      s = {1, 0x80, 0xBF};
    } else if (b >= 0xE0 && b <= 0xEF) {
      // E0: no overlong form (second byte A0..); ED: no surrogate (second byte ..9F).
      s = {2, static_cast<uint8_t>(b == 0xE0 ? 0xA0 : 0x80),
           static_cast<uint8_t>(b == 0xED ? 0x9F : 0xBF)};
    } else if (b >= 0xF0 && b <= 0xF4) {
      // F0: no overlong form (second byte 90..); F4: nothing past U+10FFFF (second byte ..8F).
      s = {3, static_cast<uint8_t>(b == 0xF0 ? 0x90 : 0x80),
           static_cast<uint8_t>(b == 0xF4 ? 0x8F : 0xBF)};
    } else {
      return std::nullopt;  // a continuation byte, C0 / C1 (overlong), F5..FF
    }
  }
  return s;
}

Utf8Guard::Utf8Guard(const std::vector<std::string>& token_bytes, int64_t vocab) : vocab_(vocab) {
  METRALE_CHECK(vocab >= static_cast<int64_t>(token_bytes.size()) &&
                    vocab <= std::numeric_limits<int32_t>::max(),
                "Utf8Guard: a vocabulary of ", vocab, " ids for ", token_bytes.size(), " tokens");
  offsets_.reserve(token_bytes.size() + 1);
  offsets_.push_back(0);
  for (const std::string& t : token_bytes) {
    blob_ += t;
    METRALE_CHECK(blob_.size() <= std::numeric_limits<uint32_t>::max(),
                  "Utf8Guard: the vocabulary's bytes pass 4 GiB");
    offsets_.push_back(static_cast<uint32_t>(blob_.size()));
  }
  between_.assign(static_cast<size_t>((vocab + 31) / 32), 0);
  for (int64_t i = 0; i < vocab; ++i) {
    if (after(Utf8State{}, static_cast<int32_t>(i)))
      between_[static_cast<size_t>(i / 32)] |= 1u << (i % 32);
  }
}

std::string_view Utf8Guard::bytes_of(int32_t token) const {
  const auto i = static_cast<size_t>(token);
  if (i + 1 >= offsets_.size()) return {};
  return std::string_view(blob_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
}

std::optional<Utf8State> Utf8Guard::after(Utf8State s, int32_t token) const {
  if (token < 0 || token >= vocab_) return std::nullopt;
  const std::string_view bytes = bytes_of(token);
  if (bytes.empty()) return s.need == 0 ? std::optional<Utf8State>(s) : std::nullopt;
  return utf8_step(s, bytes);
}

void Utf8Guard::restrict(Utf8State s, std::span<uint32_t> mask) const {
  const size_t words = std::min(mask.size(), between_.size());
  if (s.need == 0) {
    for (size_t w = 0; w < words; ++w) mask[w] &= between_[w];
    return;
  }
  // Inside a character (a token ended part-way through one): few tokens continue it, so each
  // allowed one is checked.
  for (size_t w = 0; w < words; ++w) {
    for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const auto id = static_cast<int32_t>(w * 32 + static_cast<size_t>(std::countr_zero(bits)));
      if (!after(s, id)) mask[w] &= ~(1u << (id % 32));
    }
  }
}

}  // namespace metrale
