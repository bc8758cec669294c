#pragma once
// The safetensors header, parsed as a pure function over the file's bytes so that it can be
// fuzzed without touching the filesystem.
//
// Layout: [u64 little-endian N][N bytes of JSON][data section]. The JSON is an object whose
// keys are tensor names, each {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}
// with offsets relative to the data section, plus an optional "__metadata__" object of
// string -> string.
//
// Validation is strict, because a wrong byte range is a silent wrong answer later: every
// entry has exactly those three keys, the dtype is known, shape x dtype size equals
// end - begin (computed without overflow), the range lies inside the data section, no two
// tensors overlap, and no key appears twice. Deliberately *accepted*, although the Python
// package never writes them: gaps between tensors and bytes after the last one (they change
// no tensor's meaning; the safetensors reference reader rejects them).
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace metrale {

// The safetensors reader's own bound on N; a larger header is hostile or corrupt.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data section; end - begin == nbytes()
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;                   // N, the JSON length including its padding
  uint64_t data_offset = 0;                    // 8 + N: where the data section starts in the file
  uint64_t data_bytes = 0;                     // file size - data_offset
  std::vector<SafetensorsTensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;

  // Binary search by name; nullptr when absent.
  const SafetensorsTensorInfo* find(std::string_view name) const;
};

// Parses and validates the header of a whole safetensors file held in `file_bytes`.
// `source` (usually the path) prefixes every error message. Throws metrale::Error.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes,
                                           std::string_view source);

// Bytes taken by a tensor of `dtype` and `dims`; nullopt when the size overflows 64 bits or,
// for sub-byte types, the element count does not fill whole bytes.
std::optional<uint64_t> safetensors_nbytes(DType dtype, std::span<const int64_t> dims);

}  // namespace metrale
