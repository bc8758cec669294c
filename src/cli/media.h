#pragma once
// `--image FILE` / `--video FILE` for the model-running commands: files decoded and run through
// the checkpoint's processor (preprocessor_config.json / video_preprocessor_config.json), the
// prompt's placeholders expanded, and the tower's features and M-RoPE positions made
// (engine/multimodal.h).
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/multimodal.h"

namespace metrale::cli {

struct MediaFlags {
  std::vector<std::string> images;
  std::vector<std::string> videos;

  void add_to(CLI::App& cmd);
  bool empty() const { return images.empty() && videos.empty(); }
  // The prompt `ids` with the media in place: each run of image (video) pads takes the next
  // --image (--video); a prompt without pads gets every item in front of it. Errors name the
  // file.
  MultimodalPrompt prompt(Model& model, const std::vector<int32_t>& ids) const;
};

// A media file's bytes; Error naming the path when it cannot be opened.
std::vector<uint8_t> read_bytes(const std::string& path);

}  // namespace metrale::cli
