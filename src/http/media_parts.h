#pragma once
// Images and videos in chat requests: OpenAI's content parts as vLLM accepts them
//   {"type": "image_url", "image_url": {"url": URL, "detail": ...}}   (detail is ignored)
//   {"type": "video_url", "video_url": {"url": URL}}
// (and vLLM's short forms {"image_url": URL} / {"video_url": URL}, without "type"), where URL
// is a data: URL with base64 (`data:image/png;base64,...`) or a file:// path under a
// directory the operator allowed (--allowed-media-dir). Nothing is fetched from the network:
// http(s) URLs are refused. Every refusal is a 400 naming the part
// (`messages[2].content[1].image_url`).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vision/vision_item.h"

namespace metrale::http {

struct MediaPart {
  vision::VisionKind kind = vision::VisionKind::kImage;
  std::string url;
  std::string where;  // the part, for errors: messages[i].content[j].image_url
};

// What a server accepts (flags of `metrale serve`).
struct MediaOptions {
  // Canonical directories file:// URLs may read from (canonical_media_dirs); none: file:// off.
  std::vector<std::filesystem::path> allowed_dirs;
  size_t max_bytes = size_t{20} << 20;              // one item's encoded bytes
  int64_t max_image_pixels = int64_t{4096} * 4096;  // one decoded image's (or video frame's)
  int64_t max_video_frames = 1024;                  // frames in one video's stream
  double max_video_seconds = 600;                   // one video's duration
  int64_t max_items = 8;                            // images + videos in one request
};

// --allowed-media-dir values made canonical (each must be an existing directory; Error naming
// it otherwise).
std::vector<std::filesystem::path> canonical_media_dirs(const std::vector<std::string>& dirs);

// Takes the media parts out of a chat request's messages, in order, and rewrites each to
// {"type": "image"} / {"type": "video"}, the parts chat templates render as their
// placeholders (as transformers' processors and vLLM hand them to the template). Malformed
// parts: ApiError 400 naming the part.
std::vector<MediaPart> take_media_parts(nlohmann::ordered_json& messages);

// The file a file:// URL names, if `options` allow it: absolute, no `..`, canonical (symlinks
// resolved) and inside an allowed directory, a regular file. ApiError 400 naming `where`.
std::filesystem::path resolve_media_file(std::string_view url, const MediaOptions& options,
                                         const std::string& where);

// The bytes behind a part's URL (data: or file://), at most options.max_bytes. ApiError 400
// naming the part.
std::vector<uint8_t> read_media_part(const MediaPart& part, const MediaOptions& options);

}  // namespace metrale::http
