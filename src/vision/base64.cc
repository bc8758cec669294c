// Data URIs and base64 payloads from API requests (OpenAI-style `image_url`). Strict on
// purpose: a stray character usually means a truncated or mangled upload, and failing with
// the offset is kinder than decoding garbage that later fails as a "corrupt JPEG".
#include <array>
#include <cctype>

#include "core/error.h"
#include "vision/decode.h"

namespace metrale::vision {
namespace {

constexpr int8_t kInvalid = -1;
constexpr int8_t kSpace = -2;

constexpr std::array<int8_t, 256> make_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = kInvalid;
  constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < kAlphabet.size(); ++i) t[static_cast<uint8_t>(kAlphabet[i])] = int8_t(i);
  for (char c : {' ', '\t', '\r', '\n', '\f', '\v'}) t[static_cast<uint8_t>(c)] = kSpace;
  return t;
}
constexpr std::array<int8_t, 256> kTable = make_table();

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

std::string printable(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  return metrale::detail::concat("byte 0x", std::hex, int(u));
}

}  // namespace

std::vector<uint8_t> decode_base64_payload(std::string_view input) {
  size_t start = 0;
  if (starts_with_ci(input, "data:")) {
    size_t comma = input.find(',');
    METRALE_CHECK(comma != std::string_view::npos, "data URI: no ',' separating the header from ",
                  "the payload");
    std::string_view header = input.substr(5, comma - 5);
    size_t semi = header.rfind(';');
    METRALE_CHECK(semi != std::string_view::npos && starts_with_ci(header.substr(semi), ";base64"),
                  "data URI: expected ';base64' before ',', found header '", header, "'");
    start = comma + 1;
  }
  std::vector<uint8_t> out;
  out.reserve((input.size() - start) / 4 * 3 + 3);
  uint32_t acc = 0;
  int n = 0;        // sextets in `acc`
  int padding = 0;  // '=' seen so far
  size_t symbols = 0;
  for (size_t i = start; i < input.size(); ++i) {
    const char c = input[i];
    const int8_t v = kTable[static_cast<uint8_t>(c)];
    if (v == kSpace) continue;
    if (c == '=') {
      METRALE_CHECK(n >= 2, "base64: '=' at offset ", i, " where padding cannot start");
      ++padding;
      METRALE_CHECK(n + padding <= 4, "base64: too much '=' padding at offset ", i);
      continue;
    }
    METRALE_CHECK(v != kInvalid, "base64: invalid character ", printable(c), " at offset ", i);
    METRALE_CHECK(padding == 0, "base64: data after '=' padding at offset ", i);
    acc = (acc << 6) | uint32_t(v);
    ++symbols;
    if (++n == 4) {
      out.push_back(uint8_t(acc >> 16));
      out.push_back(uint8_t(acc >> 8));
      out.push_back(uint8_t(acc));
      acc = 0;
      n = 0;
    }
  }
  METRALE_CHECK(symbols > 0, "base64: empty payload (offset ", start, ")");
  METRALE_CHECK(n != 1, "base64: truncated input, a lone symbol at the end (offset ", input.size(),
                ")");
  METRALE_CHECK(padding == 0 || n + padding == 4, "base64: bad padding at the end (offset ",
                input.size(), "): ", n, " symbols + ", padding, " '='");
  if (n == 2) out.push_back(uint8_t(acc >> 4));
  if (n == 3) {
    out.push_back(uint8_t(acc >> 10));
    out.push_back(uint8_t(acc >> 2));
  }
  return out;
}

}  // namespace metrale::vision
