#pragma once
// The target-size rules of the HF vision processors ("smart_resize"): both sides become
// multiples of `factor` (= patch_size * merge_size), the pixel count lands inside
// [min_pixels, max_pixels], and the aspect ratio is kept as far as that allows. The float
// arithmetic (Python's round-half-even `round`, floor/ceil of double quotients) is reproduced
// step by step, because an off-by-one here changes the grid and the token count.
#include <cstdint>

namespace metrale::vision {

struct ResizeTarget {
  int height = 0;
  int width = 0;
};

// transformers models/qwen2_vl/image_processing_qwen2_vl.py::smart_resize (also the Qwen2-VL
// video processor's). Used for Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5 images.
ResizeTarget qwen_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                               int64_t max_pixels);

// transformers models/glm4v/image_processing_glm4v.py::smart_resize, shared verbatim by the
// GLM-4V video processor and the Qwen3-VL video processor: the pixel budget counts
// `num_frames` frames (rounded to `temporal_factor`), and sides shorter than `factor` are
// first scaled up (aspect kept) to reach it.
ResizeTarget temporal_smart_resize(int64_t num_frames, int64_t height, int64_t width,
                                   int64_t temporal_factor, int64_t factor, int64_t min_pixels,
                                   int64_t max_pixels);

}  // namespace metrale::vision
