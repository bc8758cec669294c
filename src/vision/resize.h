#pragma once
// Bicubic resampling of RGB8 images, bit-exact with the two resizers the HF processors reach:
//
//  - kTorchvision: torchvision.transforms.v2.functional.resize(uint8 tensor, BICUBIC,
//    antialias=True) on CPU, i.e. torch's uint8 anti-aliased separable kernel
//    (aten/src/ATen/native/cpu/UpSampleKernel.cpp + UpSampleKernelAVXAntialias.h). The
//    transformers 5.x image and video processors use this path by default whenever
//    torchvision is installed ("torchvision" backend).
//  - kPil: PIL's Image.resize(BICUBIC) (libImaging/Resample.c, Pillow 13), used by the
//    "*ImageProcessorPil" classes.
//
// Both compute Keys-cubic (a = -0.5) weights in double over a support of 2*max(scale, 1)
// (the anti-aliasing rule), normalise them per output pixel, round them to fixed point and
// accumulate in integers with a rounding bias, clipping each pass to [0, 255]. They differ in
// three details that change results, so each is reproduced exactly:
//   fixed-point precision  PIL: always 22 bits.  torch: the largest p <= 22 for which the
//                          largest weight * 2^(p+1) still fits in int16, per axis.
//   cubic polynomial       PIL: (((x-5)x+8)x-4)a.  torch: ((ax-5a)x+8a)x-4a (same maths,
//                          different double rounding).
//   pass order             torch: horizontal then vertical.  PIL 13: vertical first when the
//                          height shrinks by more than twice as many pixels as the width.
#include "vision/image.h"

namespace metrale::vision {

enum class ResizeKernel { kTorchvision, kPil };

const char* resize_kernel_name(ResizeKernel kernel);

// Returns `in` resized to out_width x out_height. Equal sizes return a copy (both peers skip
// resampling then). Throws metrale::Error on empty input or non-positive output sizes.
Image resize_bicubic(const Image& in, int out_width, int out_height, ResizeKernel kernel);

}  // namespace metrale::vision
