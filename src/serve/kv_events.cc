#include "serve/kv_events.h"

namespace metrale {
namespace {

// FNV-1a over bytes, then splitmix64's finaliser to spread the bits.
struct Hasher {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ull;
    }
  }
  void u64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, 8);
  }
  uint64_t finish() const {
    uint64_t z = h + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

}  // namespace

uint64_t kv_block_hash(std::optional<uint64_t> parent, std::span<const int32_t> tokens,
                       std::string_view lora_name) {
  Hasher h;
  h.u64(parent.has_value() ? 1 : 0);
  h.u64(parent.value_or(0));
  h.u64(lora_name.size());
  h.bytes(lora_name.data(), lora_name.size());
  h.u64(tokens.size());
  for (int32_t t : tokens) h.u64(static_cast<uint32_t>(t));
  return h.finish() & 0x7fffffffffffffffull;
}

}  // namespace metrale
