#pragma once
// Helpers shared by the safetensors tests: raw files built from header text, scratch dirs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"

namespace metrale::test {

// [u64 N][header][data_bytes bytes of pattern]; `n_override` replaces N to fake bad lengths.
inline std::vector<std::byte> raw_file(std::string_view header, size_t data_bytes,
                                       std::optional<uint64_t> n_override = std::nullopt) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  const uint64_t n = n_override.value_or(header.size());
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  for (size_t i = 0; i < header.size(); ++i) out[8 + i] = static_cast<std::byte>(header[i]);
  for (size_t i = 0; i < data_bytes; ++i)
    out[8 + header.size() + i] = static_cast<std::byte>(i * 7 + 3);
  return out;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void write_text(const std::filesystem::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  for (size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<std::byte>(chars[i]);
  return out;
}

}  // namespace metrale::test
