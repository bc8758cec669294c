#pragma once
// Reading the HF reference fixtures (tests/data/fixtures/<type>_<dtype>/reference.safetensors,
// documented in tests/data/fixtures/README.md).
#include <cstring>
#include <string>
#include <vector>

#include "io/safetensors/file.h"

namespace metrale::testing {

inline std::string fixture_dir(const std::string& name) { return "tests/data/fixtures/" + name; }

class Reference {
 public:
  // `file`: the fixture's reference.safetensors, or another file of the same layout beside it.
  explicit Reference(const std::string& name, const std::string& file = "reference.safetensors")
      : file_(SafetensorsFile::open(fixture_dir(name) + "/" + file)) {}
  // A file of the same layout elsewhere (a shipped checkpoint's references).
  struct Path {
    std::string path;
  };
  explicit Reference(const Path& p) : file_(SafetensorsFile::open(p.path)) {}

  bool has(const std::string& key) const { return file_.find(key) != nullptr; }

  std::vector<float> floats(const std::string& key) const {
    const auto& t = file_.at(key);
    std::vector<float> out(static_cast<size_t>(t.shape.numel()));
    std::memcpy(out.data(), file_.bytes(t).data(), out.size() * sizeof(float));
    return out;
  }
  std::vector<int32_t> ids(const std::string& key) const {
    const auto& t = file_.at(key);
    std::vector<int64_t> wide(static_cast<size_t>(t.shape.numel()));
    std::memcpy(wide.data(), file_.bytes(t).data(), wide.size() * sizeof(int64_t));
    return {wide.begin(), wide.end()};
  }

 private:
  SafetensorsFile file_;
};

// Largest |a - b|.
inline float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace metrale::testing
