// libFuzzer target: sniff + decode of every still format (JPEG, PNG, GIF, WebP, BMP), GIF
// frame iteration, and the base64 front end. Any outcome but an image or metrale::Error
// (a crash, sanitizer report, hang or runaway allocation) is a bug. Limits are kept small so
// the fuzzer explores parsing rather than large allocations.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "vision/decode.h"
#include "vision/gif_frames.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace metrale::vision;
  const std::span<const uint8_t> bytes(data, size);
  const DecodeLimits limits{.max_side = 4096, .max_pixels = 1 << 22};
  try {
    const Image image = decode_image(bytes, limits);
    if (image.rgb.size() != size_t(image.width) * image.height * 3) __builtin_trap();
  } catch (const metrale::Error&) {
  }
  if (sniff_format(bytes) == ImageFormat::kGif) {
    try {
      decode_gif_frames(bytes, limits, 16, size_t(64) << 20);
    } catch (const metrale::Error&) {
    }
  }
  try {
    decode_base64_payload(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const metrale::Error&) {
  }
  return 0;
}
