#pragma once
// RMSNorm as the layers use it: the weight (widened to f32 at load), its eps and convention,
// and the fused "add the pending residual, then normalise" step between sub-blocks.
#include <string>
#include <vector>

#include "io/config/model_config.h"
#include "layers/forward_context.h"
#include "weights/tensor_loader.h"

namespace metrale {

struct Norm {
  std::vector<float> weight;  // [width]
  float eps = 1e-6f;
  NormStyle style = NormStyle::kWeight;

  bool empty() const { return weight.empty(); }
  // out = norm(x), whole rows, or each run of `group` values (per-head qk-norm).
  void apply(Backend& backend, ConstRows x, Rows out, int64_t group = 0) const {
    backend.rms_norm(
        {.x = x, .out = out, .weight = weight.data(), .eps = eps, .style = style, .group = group});
  }
};

// `name` [width], with the config's rms_norm_eps and its family's weight convention.
Norm load_norm(TensorLoader& loader, const ModelConfig& config, const std::string& name,
               int64_t width);

// Adds a pending delta and normalises: out = norm(h += delta), or out = norm(h).
inline void add_and_norm(Backend& backend, Residual& r, Rows out, const Norm& norm) {
  RmsNormArgs a{.x = r.pending ? ConstRows(r.delta) : ConstRows(r.h),
                .out = out,
                .weight = norm.weight.data(),
                .eps = norm.eps,
                .style = norm.style};
  if (r.pending) a.residual = r.h;
  backend.rms_norm(a);
  r.pending = false;
}

}  // namespace metrale
