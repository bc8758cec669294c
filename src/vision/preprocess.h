#pragma once
// Image and video preprocessing for the Qwen-VL and GLM-4V families, equal to transformers
// 5.24's processors: smart_resize -> bicubic resize (uint8) -> rescale + normalise ->
// temporal repeat / pad -> patchify, giving pixel_values and grid_thw.
//
// GLM-4V differs from Qwen2-VL only in its smart_resize (temporal factor, small sides scaled
// up first). transformers' Glm4vImageProcessor does no aspect-preserving fit and no padding
// to a canvas: it resizes straight to the smart_resize target, like Qwen, and so do we.
#include <span>

#include "vision/image.h"
#include "vision/processor_config.h"
#include "vision/smart_resize.h"
#include "vision/vision_item.h"

namespace metrale::vision {

// The size the processor resizes an image to (no resize when do_resize is false).
ResizeTarget image_target_size(const ImageProcessorConfig& config, int height, int width);

VisionItem preprocess_image(const Image& image, const ImageProcessorConfig& config);

// `frames`: the decoded video (all frames, same size), `fps`: its native frame rate. Frames
// are sampled per config (sample_frame_indices), resized, normalised, padded to a multiple of
// temporal_patch_size by repeating the last one, and patchified.
VisionItem preprocess_video(std::span<const Image> frames, double fps,
                            const VideoProcessorConfig& config);

}  // namespace metrale::vision
