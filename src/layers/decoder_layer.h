#pragma once
// One decoder layer as a composition of blocks:
//   x = norm(h); h += mixer(x); x = norm(h); h += ffn(x)
// with each residual add deferred into the next norm (forward_context.h Residual).
#include <memory>

#include "layers/block.h"
#include "layers/norm.h"

namespace metrale {

class DecoderLayer {
 public:
  DecoderLayer(Norm input_norm, std::unique_ptr<Mixer> mixer, Norm post_norm,
               std::unique_ptr<Ffn> ffn);

  // Runs the layer on ctx.n_rows rows of `r`; on return the FFN's output is pending in r.delta.
  void forward(const ForwardContext& ctx, const LayerState& state, Residual& r, Workspace ws) const;
  size_t workspace_floats(int64_t max_rows) const;

  const Norm& input_norm() const { return input_norm_; }
  const Mixer& mixer() const { return *mixer_; }
  const Ffn& ffn() const { return *ffn_; }
  void lora_sites(LoraSites& out) {
    mixer_->lora_sites(out);
    ffn_->lora_sites(out);
  }

 private:
  Norm input_norm_;
  std::unique_ptr<Mixer> mixer_;
  Norm post_norm_;
  std::unique_ptr<Ffn> ffn_;
};

}  // namespace metrale
