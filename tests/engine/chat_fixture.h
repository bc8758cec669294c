#pragma once
// A vision fixture's chat.safetensors (tools/fixtures/models/vision_chat_fixtures.py): an image
// inside a multi-turn chat, as transformers' processor (apply_chat_template with the
// checkpoint's chat_template.jinja) and model made it. Cases "turn1" (an image and a question),
// "followup" (turn1, the assistant's answer, a text question) and "second_image" (turn1, the
// answer, a question with a second image). Shared by the parity test (tests/engine) and the
// scheduler's media tests (tests/serve).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/fixture_util.h"
#include "io/safetensors/file.h"
#include "vision/preprocess.h"

namespace metrale::testing {

class ChatFixture {
 public:
  static constexpr const char* kCases[] = {"turn1", "followup", "second_image"};

  explicit ChatFixture(const std::string& fixture)
      : file_(SafetensorsFile::open(fixture_dir(fixture) + "/chat.safetensors")) {}
  template <class T>
  std::vector<T> get(const std::string& key) const {
    const auto& t = file_.at(key);
    std::vector<T> out(static_cast<size_t>(t.shape.numel()));
    std::memcpy(out.data(), file_.bytes(t).data(), out.size() * sizeof(T));
    return out;
  }
  std::vector<int32_t> ids(const std::string& c) const {
    const std::vector<int64_t> wide = get<int64_t>(c + ".ids");
    return {wide.begin(), wide.end()};
  }
  std::vector<int32_t> greedy(const std::string& c) const {
    const std::vector<int64_t> wide = get<int64_t>(c + ".greedy");
    return {wide.begin(), wide.end()};
  }
  int64_t scalar(const std::string& key) const { return get<int64_t>(key)[0]; }
  // The case's messages as JSON, image parts as {"type": "image"}.
  const std::string& messages(const std::string& c) const {
    return file_.metadata().at(c + ".messages");
  }
  // The chat template's extra variables as a JSON object ({"enable_thinking": false}).
  const std::string& template_kwargs() const { return file_.metadata().at("chat_template_kwargs"); }
  const std::string& answer() const { return file_.metadata().at("answer"); }
  // The processor's images in the case's order: image 0 (every case), image 1 (second_image).
  std::vector<vision::VisionItem> images(const std::string& c) const {
    const std::vector<int64_t> g = get<int64_t>("image_grid_thw");
    const std::vector<float> pixels = get<float>("pixel_values");
    const size_t n = c == "second_image" ? 2 : 1;
    std::vector<vision::VisionItem> out;
    int64_t start = 0;
    for (size_t i = 0; i < n; ++i) {
      vision::VisionItem it;
      it.kind = vision::VisionKind::kImage;
      it.grid_thw = {g[3 * i], g[3 * i + 1], g[3 * i + 2]};
      it.patch_dim = 96;
      it.merge_size = 2;
      it.pixels.assign(pixels.begin() + start * 96, pixels.begin() + (start + it.n_patches()) * 96);
      start += it.n_patches();
      out.push_back(std::move(it));
    }
    return out;
  }

 private:
  SafetensorsFile file_;
};

}  // namespace metrale::testing
