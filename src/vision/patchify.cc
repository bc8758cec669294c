#include "vision/patchify.h"

#include "core/error.h"

namespace metrale::vision {

NormalizeTable make_normalize_table(const PatchGeometry& g) {
  NormalizeTable t;
  const bool pil = g.resize_kernel == ResizeKernel::kPil;
  for (int c = 0; c < 3; ++c) {
    const float mean = g.image_mean[static_cast<size_t>(c)];
    const float std = g.image_std[static_cast<size_t>(c)];
    // Python computes 1.0 / rescale_factor in double; torch multiplies the float32 mean by it
    // in float32.
    const auto inv = static_cast<float>(1.0 / g.rescale_factor);
    const float fused_mean = mean * inv;
    const float fused_std = std * inv;
    for (int x = 0; x < 256; ++x) {
      float v = static_cast<float>(x);
      if (g.do_rescale && g.do_normalize && !pil) {
        v = (v - fused_mean) / fused_std;
      } else {
        if (g.do_rescale) {
          v = pil ? static_cast<float>(static_cast<double>(x) * g.rescale_factor)
                  : v * static_cast<float>(g.rescale_factor);
        }
        if (g.do_normalize) v = (v - mean) / std;
      }
      t.value[static_cast<size_t>(c)][static_cast<size_t>(x)] = v;
    }
  }
  return t;
}

void patchify(std::span<const Image* const> frames, const PatchGeometry& g,
              const NormalizeTable& table, float* out) {
  const int ps = g.patch_size;
  const int m = g.merge_size;
  const int tps = g.temporal_patch_size;
  METRALE_CHECK(!frames.empty() && frames.size() % static_cast<size_t>(tps) == 0,
                "patchify: ", frames.size(),
                " frames is not a positive multiple of temporal_patch_size ", tps);
  const int height = frames[0]->height;
  const int width = frames[0]->width;
  for (const Image* f : frames) {
    METRALE_CHECK(f->height == height && f->width == width, "patchify: frames differ in size (",
                  f->width, "x", f->height, " vs ", width, "x", height, ")");
  }
  METRALE_CHECK(height % (ps * m) == 0 && width % (ps * m) == 0, "patchify: ", width, "x", height,
                " is not a multiple of patch_size * merge_size = ", ps * m);
  const int grid_t = static_cast<int>(frames.size()) / tps;
  const int blocks_h = height / (ps * m);
  const int blocks_w = width / (ps * m);
  float* dst = out;
  for (int t = 0; t < grid_t; ++t) {
    for (int bh = 0; bh < blocks_h; ++bh) {
      for (int bw = 0; bw < blocks_w; ++bw) {
        for (int mh = 0; mh < m; ++mh) {
          for (int mw = 0; mw < m; ++mw) {
            const int y0 = (bh * m + mh) * ps;
            const int x0 = (bw * m + mw) * ps;
            for (int c = 0; c < 3; ++c) {
              const float* lut = table.value[static_cast<size_t>(c)].data();
              for (int tp = 0; tp < tps; ++tp) {
                const Image& f = *frames[static_cast<size_t>(t * tps + tp)];
                for (int py = 0; py < ps; ++py) {
                  const uint8_t* src = f.row(y0 + py) + static_cast<size_t>(x0) * 3 + c;
                  for (int px = 0; px < ps; ++px) *dst++ = lut[src[px * 3]];
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace metrale::vision
