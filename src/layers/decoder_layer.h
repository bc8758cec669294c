#pragma once
// One decoder layer as a composition of blocks:
//   x = norm(h); h += mixer(x); x = norm(h); h += ffn(x)
// with each residual add deferred into the next norm (norm.h Residual).
#include <memory>

#include "layers/block.h"
#include "layers/norm.h"

namespace metrale {

class DecoderLayer {
 public:
  DecoderLayer(Norm input_norm, std::unique_ptr<Mixer> mixer, Norm post_norm,
               std::unique_ptr<Ffn> ffn);

  // Records layer `index` over the residual `r`; after it the FFN's output is pending in
  // r.delta.
  void record(Graph& g, int32_t index, Residual& r) const;

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
