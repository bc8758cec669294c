#pragma once
// Writes .safetensors files, for tests and tools. The output matches the Python package's
// byte for byte (same tensor order, compact JSON with keys in the same order, header padded
// with spaces to a multiple of 8 bytes), provided there is at most one metadata entry (the
// package emits metadata in hash-map order).
#include <cstddef>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace metrale {

class SafetensorsWriter {
 public:
  // Adds a tensor; `bytes` must hold exactly shape x dtype bytes (little-endian, row-major).
  // Throws metrale::Error on a size mismatch, a repeated or reserved name.
  void add(std::string name, DType dtype, const Shape& shape, std::span<const std::byte> bytes);
  void set_metadata(std::string key, std::string value);

  // The whole file's bytes.
  std::vector<std::byte> serialize() const;
  // Writes serialize() to `path`; throws metrale::Error naming the path on failure.
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Entry> entries_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace metrale
