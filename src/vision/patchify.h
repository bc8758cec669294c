#pragma once
// Rescale + normalise + patchify, fused: resized uint8 frames -> the processor's f32 patch
// rows. Because the input is uint8, each channel's normalisation is a 256-entry table
// computed with the processor's exact float32 operation order (see NormalizeTable), so the
// output matches pixel_values bit for bit.
#include <array>
#include <span>

#include "vision/image.h"
#include "vision/processor_config.h"

namespace metrale::vision {

struct NormalizeTable {
  std::array<std::array<float, 256>, 3> value{};  // [channel][uint8 value]
};

// Torchvision backend (fused, TorchvisionBackend.rescale_and_normalize):
//   mean' = f32(mean) * f32(1 / rescale_factor), std' likewise, out = (f32(x) - mean') / std'.
// PIL backend (rescale, then normalize, in numpy):
//   r = f32(f64(x) * rescale_factor), out = (r - f32(mean)) / f32(std).
// Rescale alone: torchvision f32(x) * f32(rescale_factor); PIL f32(f64(x) * rescale_factor).
NormalizeTable make_normalize_table(const PatchGeometry& g);

// Writes rows for `frames` (all the same size, count a multiple of temporal_patch_size, sides
// multiples of patch_size * merge_size) into `out` ([n_rows, C*T*ps*ps]). Row order
// (t, h-block, w-block, h-in-block, w-in-block); each row (C, T, ps, ps). A still image is
// passed as temporal_patch_size copies of the same pointer.
void patchify(std::span<const Image* const> frames, const PatchGeometry& g,
              const NormalizeTable& table, float* out);

}  // namespace metrale::vision
