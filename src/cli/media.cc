#include "cli/media.h"

#include <fstream>
#include <iterator>

#include "core/error.h"
#include "vision/decode.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/video.h"

namespace metrale::cli {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  METRALE_CHECK(in.good(), path, ": cannot open file");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void MediaFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--image", images,
                 "an image for a vision-language model (repeatable; each run of image pad tokens "
                 "in the prompt takes the next, or all go before the prompt)");
  cmd.add_option("--video", videos, "a video clip for a vision-language model (repeatable)");
}

MultimodalPrompt MediaFlags::prompt(Model& model, const std::vector<int32_t>& ids) const {
  METRALE_CHECK(model.vision() != nullptr, model.config().source, ": model_type \"",
                model.config().model_type,
                "\" has no vision tower metrale runs, so --image / --video cannot be used");
  const std::string dir = model.dir().string();
  std::vector<vision::VisionItem> items;  // images, then videos
  if (!images.empty()) {
    const vision::ImageProcessorConfig config = vision::load_image_processor_config(dir);
    for (const std::string& path : images) {
      items.push_back(with_context(path, [&] {
        return vision::preprocess_image(vision::decode_image(read_bytes(path)), config);
      }));
    }
  }
  if (!videos.empty()) {
    const vision::VideoProcessorConfig config = vision::load_video_processor_config(dir);
    for (const std::string& path : videos) {
      items.push_back(with_context(path, [&] {
        const vision::VideoFrames frames = vision::decode_video_file(path);
        METRALE_CHECK(!frames.frames.empty(), "the video decoded to no frames");
        const double fps = frames.fps > 0 ? frames.fps : 24.0;  // HF's default when unknown
        return vision::preprocess_video(frames.frames, fps, config);
      }));
    }
  }
  const std::vector<int32_t> expanded = place_media(
      model.vision()->config(), ids, items,
      static_cast<int32_t>(model.config().bos_token_id.value_or(-1)), model.tokenizer());
  return make_multimodal_prompt(model, expanded, items);
}

}  // namespace metrale::cli
