#pragma once
// One decoder layer as a composition of blocks:
//   x = norm(h); h += mixer(x); x = norm(h); h += ffn(x)
// with each residual add deferred into the next norm (norm.h Residual). With sandwich norms
// (GLM-4's post_self_attn_layernorm / post_mlp_layernorm) each block's output is normalised
// before it is added: h += norm(mixer(x)), h += norm(ffn(x)).
#include <memory>
#include <utility>

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

  // Normalise the mixer's and the FFN's outputs before their residual adds.
  void set_sandwich_norms(Norm after_mixer, Norm after_ffn) {
    after_mixer_ = std::move(after_mixer);
    after_ffn_ = std::move(after_ffn);
  }

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
  Norm after_mixer_, after_ffn_;  // empty: none
};

}  // namespace metrale
