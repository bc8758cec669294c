#pragma once
// RMSNorm as the layers use it: the weight (widened to f32 at load, in backend memory), its
// eps and convention, and the fused "add the pending residual, then normalise" step between
// sub-blocks.
#include <string>

#include "graph/graph.h"
#include "io/config/model_config.h"
#include "weights/tensor_loader.h"

namespace metrale {

struct Norm {
  DeviceFloats weight;  // [width]
  float eps = 1e-6f;
  NormStyle style = NormStyle::kWeight;

  bool empty() const { return weight.empty(); }
  // out = norm(x), whole rows, or each run of `group` values (per-head qk-norm).
  void record(Graph& g, Tensor x, Tensor out, int64_t group = 0) const {
    g.add(node::RmsNorm{
        .x = x, .out = out, .weight = weight.data(), .eps = eps, .style = style, .group = group});
  }
};

// `name` [width], with the config's rms_norm_eps and its family's weight convention.
Norm load_norm(TensorLoader& loader, const ModelConfig& config, const std::string& name,
               int64_t width);

// The residual stream h, plus the output of the previous sub-block (`delta`) still to be
// added. Deferring the add lets the next RMSNorm fuse it (h += delta; x = norm(h)), the way
// HF's `hidden_states = residual + hidden_states` is followed by a norm.
struct Residual {
  Tensor h;      // [rows, hidden]
  Tensor delta;  // [rows, hidden]
  bool pending = false;
};

// Adds a pending delta and normalises: out = norm(h += delta), or out = norm(h).
inline void add_and_norm(Graph& g, Residual& r, Tensor out, const Norm& norm) {
  node::RmsNorm n{.x = r.pending ? r.delta : r.h,
                  .out = out,
                  .weight = norm.weight.data(),
                  .eps = norm.eps,
                  .style = norm.style};
  if (r.pending) n.residual = r.h;
  g.add(n);
  r.pending = false;
}

}  // namespace metrale
