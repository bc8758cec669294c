#pragma once
// GIF decoding into composed RGB frames, reproducing what PIL yields when iterating frames
// with seek() and calling convert("RGB") (Pillow's default RGB_AFTER_FIRST strategy):
// frame 0 is a palette image filled with its transparent index; later frames are pasted onto
// the running canvas through their transparency mask, after the previous frame's disposal
// (2: fill with the transparent or background colour, 3: restore) is applied. PIL quirks kept
// on purpose: a disposal of 0 keeps the previous frame's method, and a palette that is just
// the grey ramp makes the whole animation greyscale.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "vision/decode.h"

namespace metrale::vision {

struct GifAnimation {
  int width = 0;
  int height = 0;
  std::vector<Image> frames;
  std::vector<int> durations_ms;  // per frame; 0 where the frame has no graphic control block
};

// Decodes at most `max_frames` frames; every frame is checked against `limits`, and the sum
// of frame bytes against `max_total_bytes`.
GifAnimation decode_gif_frames(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                               size_t max_frames, size_t max_total_bytes = size_t(1) << 31);

}  // namespace metrale::vision
