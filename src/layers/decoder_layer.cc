#include "layers/decoder_layer.h"

namespace metrale {

DecoderLayer::DecoderLayer(Norm input_norm, std::unique_ptr<Mixer> mixer, Norm post_norm,
                           std::unique_ptr<Ffn> ffn)
    : input_norm_(std::move(input_norm)),
      mixer_(std::move(mixer)),
      post_norm_(std::move(post_norm)),
      ffn_(std::move(ffn)) {}

void DecoderLayer::record(Graph& g, int32_t index, Residual& r) const {
  const Tensor x = g.buffer("x", r.h.n_cols);
  add_and_norm(g, r, x, input_norm_);
  {
    const Graph::Scope scope(g, "mixer");
    mixer_->record(g, {.x = x, .out = r.delta, .layer = index});
  }
  if (!after_mixer_.empty()) after_mixer_.record(g, r.delta, r.delta);
  r.pending = true;
  add_and_norm(g, r, x, post_norm_);
  {
    const Graph::Scope scope(g, "ffn");
    ffn_->record(g, {.x = x, .out = r.delta, .layer = index});
  }
  if (!after_ffn_.empty()) after_ffn_.record(g, r.delta, r.delta);
  r.pending = true;
}

}  // namespace metrale
