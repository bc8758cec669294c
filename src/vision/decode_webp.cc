// WebP through libwebp's animation decoder, as PIL does for every WebP (still or animated):
// frame 1 composed on the canvas as non-premultiplied RGBA, alpha then dropped. The canvas
// size is read with WebPGetFeatures and checked before the decoder allocates the canvas.
#include <cstring>
#include <string_view>

#include <webp/decode.h>
#include <webp/demux.h>

#include "core/error.h"
#include "vision/decode_internal.h"
#include "vision/exif.h"

namespace metrale::vision::detail {
namespace {

struct AnimDecoder {
  WebPAnimDecoder* dec = nullptr;
  ~AnimDecoder() { WebPAnimDecoderDelete(dec); }
};

std::string_view status_name(VP8StatusCode s) {
  switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "user abort";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "not enough data (truncated file)";
    default:
      return "ok";
  }
}

int find_orientation(const WebPDemuxer* demux) {
  WebPChunkIterator it;
  int orientation = 0;
  if (WebPDemuxGetChunk(demux, "EXIF", 1, &it)) {
    orientation = exif_orientation({it.chunk.bytes, it.chunk.size});
    WebPDemuxReleaseChunkIterator(&it);
  }
  if (orientation == 0 && WebPDemuxGetChunk(demux, "XMP ", 1, &it)) {
    orientation = xmp_orientation(
        std::string_view(reinterpret_cast<const char*>(it.chunk.bytes), it.chunk.size));
    WebPDemuxReleaseChunkIterator(&it);
  }
  return orientation == 0 ? 1 : orientation;
}

}  // namespace

DecodedStill decode_webp(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  METRALE_CHECK(status == VP8_STATUS_OK, "WebP: bad header: ", status_name(status));
  check_dimensions(features.width, features.height, limits, "WebP");

  WebPAnimDecoderOptions options;
  METRALE_CHECK(WebPAnimDecoderOptionsInit(&options), "WebP: libwebp version mismatch");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  WebPData data{bytes.data(), bytes.size()};
  AnimDecoder d;
  d.dec = WebPAnimDecoderNew(&data, &options);
  METRALE_CHECK(d.dec != nullptr, "WebP: cannot parse the container (corrupt or truncated)");
  WebPAnimInfo info;
  METRALE_CHECK(WebPAnimDecoderGetInfo(d.dec, &info), "WebP: cannot read the canvas info");
  DecodedStill still;
  still.image = new_image(info.canvas_width, info.canvas_height, limits, "WebP");
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  METRALE_CHECK(WebPAnimDecoderGetNext(d.dec, &rgba, &timestamp) && rgba != nullptr,
                "WebP: corrupt or truncated image data");
  const size_t n = size_t(still.image.width) * still.image.height;
  for (size_t i = 0; i < n; ++i) std::memcpy(&still.image.rgb[3 * i], rgba + 4 * i, 3);
  still.orientation = find_orientation(WebPAnimDecoderGetDemuxer(d.dec));
  return still;
}

}  // namespace metrale::vision::detail
