#include "layers/decoder_layer.h"

#include <algorithm>

namespace metrale {

DecoderLayer::DecoderLayer(Norm input_norm, std::unique_ptr<Mixer> mixer, Norm post_norm,
                           std::unique_ptr<Ffn> ffn)
    : input_norm_(std::move(input_norm)),
      mixer_(std::move(mixer)),
      post_norm_(std::move(post_norm)),
      ffn_(std::move(ffn)) {}

size_t DecoderLayer::workspace_floats(int64_t max_rows) const {
  const auto width = static_cast<int64_t>(input_norm_.weight.size());
  return rows_floats(max_rows, width) +
         std::max(mixer_->workspace_floats(max_rows), ffn_->workspace_floats(max_rows));
}

void DecoderLayer::forward(const ForwardContext& ctx, const LayerState& state, Residual& r,
                           Workspace ws) const {
  Backend& be = *ctx.backend;
  const int64_t n = ctx.n_rows;
  const Rows x = ws.rows(n, r.h.n_cols);
  const Rows delta{r.delta.data, n, r.delta.n_cols, r.delta.stride};
  add_and_norm(be, r, x, input_norm_);
  mixer_->forward(ctx, state, x, delta, ws);
  r.pending = true;
  add_and_norm(be, r, x, post_norm_);
  ffn_->forward(ctx, x, delta, ws);
  r.pending = true;
}

}  // namespace metrale
