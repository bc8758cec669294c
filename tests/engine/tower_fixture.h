#pragma once
// A vision fixture's tower.safetensors (tools/fixtures/models/vision_tower_fixtures.py): its
// preprocessed items as preprocessing hands them over, and its prompts' ids. Shared by the
// parity tests (tests/engine) and the scheduler's media tests (tests/serve).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/fixture_util.h"
#include "io/safetensors/file.h"
#include "vision/preprocess.h"

namespace metrale::testing {

class TowerFixture {
 public:
  explicit TowerFixture(const std::string& fixture = "qwen2_vl_f32")
      : file_(SafetensorsFile::open(fixture_dir(fixture) + "/tower.safetensors")) {}
  template <class T>
  std::vector<T> get(const std::string& key) const {
    const auto& t = file_.at(key);
    std::vector<T> out(static_cast<size_t>(t.shape.numel()));
    std::memcpy(out.data(), file_.bytes(t).data(), out.size() * sizeof(T));
    return out;
  }
  // Item i (0, 1: images; 2: the video) as preprocessing hands it over.
  vision::VisionItem item(size_t i) const {
    const std::vector<int64_t> g = get<int64_t>("grid_thw");
    const std::vector<float> pixels = get<float>("pixel_values");
    int64_t start = 0;
    for (size_t k = 0; k < i; ++k) start += g[3 * k] * g[3 * k + 1] * g[3 * k + 2];
    vision::VisionItem it;
    it.kind = i == 2 ? vision::VisionKind::kVideo : vision::VisionKind::kImage;
    it.grid_thw = {g[3 * i], g[3 * i + 1], g[3 * i + 2]};
    it.patch_dim = 96;
    it.merge_size = 2;
    it.pixels.assign(pixels.begin() + start * 96, pixels.begin() + (start + it.n_patches()) * 96);
    return it;
  }
  // The ids of prompt `name` ("<name>.ids").
  std::vector<int32_t> ids(const std::string& name) const {
    const std::vector<int64_t> wide = get<int64_t>(name + ".ids");
    return {wide.begin(), wide.end()};
  }

 private:
  SafetensorsFile file_;
};

}  // namespace metrale::testing
