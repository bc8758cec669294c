#include "layers/mtp_layer.h"

#include <sstream>

#include "core/error.h"

namespace metrale {

MtpLayer::MtpLayer(MtpLayerParts parts) : parts_(std::move(parts)) {
  METRALE_CHECK(parts_.layer != nullptr, parts_.prefix, ": an MTP layer needs its decoder layer");
}

MtpIo MtpLayer::record(Graph& g, const WeightTensor& embed, const Linear& lm_head) const {
  const int64_t H = embed.n_in;
  const Linear& head = own_head() ? parts_.head : lm_head;
  METRALE_CHECK(parts_.eh_proj.n_in() == 2 * H && parts_.eh_proj.n_out() == H && head.n_in() == H,
                parts_.prefix, ": eh_proj [", parts_.eh_proj.n_out(), ", ", parts_.eh_proj.n_in(),
                "] and the head's input ", head.n_in(), " do not fit hidden size ", H);
  MtpIo io;
  const Tensor hidden_in = g.buffer("hidden_in", H, RowSpace::kRows, BufferKind::kExternal);
  Residual r{.h = g.buffer("h", H, RowSpace::kRows, BufferKind::kExternal),
             .delta = g.buffer("delta", H, RowSpace::kRows, BufferKind::kExternal)};
  io.hidden_in = hidden_in.buf;
  io.h = r.h.buf;
  io.delta = r.delta.buf;
  {
    const Graph::Scope scope(g, "mtp_input");
    const Tensor e = g.buffer("embed", H);
    g.add(node::Embedding{.table = &embed, .out = e});
    if (parts_.zero_first_key) {
      // vLLM zeroes the embedding of the row at position 0 (deepseek_mtp.py: "masking inputs at
      // position 0, as not needed by MTP"); its drafter rows sit at the target's positions, so
      // that is key 0's row. The engine injects a zero row there.
      const Tensor zeros = g.buffer("zeros", H, RowSpace::kInjected, BufferKind::kExternal);
      io.zeros = zeros.buf;
      g.add(node::InjectRows{.x = zeros, .out = e}, When::kInjected);
    }
    const Tensor cat = g.buffer("cat", 2 * H);  // [enorm(e) | hnorm(h)]
    parts_.embed_norm.record(g, e, cat.cols(0, H));
    parts_.hidden_norm.record(g, hidden_in, cat.cols(H, H));
    parts_.eh_proj.record(g, cat, r.h);
  }
  {
    const Graph::Scope scope(g, "mtp_layer");
    parts_.layer->record(g, 0, r);
  }
  // The layer's output for every row: the hidden the next chained draft reads.
  g.add(node::Add{.x = r.delta, .y = r.h});
  const Graph::Condition wanted(g, When::kWanted);
  const Graph::Scope scope(g, "mtp_head");
  const Tensor y = g.buffer("y", H, RowSpace::kWanted);
  g.add(node::GatherWanted{.x = r.h, .out = y});
  const Tensor x = g.buffer("x", H, RowSpace::kWanted, BufferKind::kExternal);
  io.normed = x.buf;
  parts_.head_norm.record(g, y, x);
  const Tensor logits = g.buffer("logits", head.n_out(), RowSpace::kWanted, BufferKind::kExternal);
  io.logits = logits.buf;
  head.record(g, x, logits);
  return io;
}

std::string MtpLayer::describe() const {
  std::ostringstream os;
  os << parts_.prefix << "*: eh_proj [" << parts_.eh_proj.n_out() << ", " << parts_.eh_proj.n_in()
     << "], " << parts_.layer->mixer().describe() << "; " << parts_.layer->ffn().describe()
     << "; head: " << (own_head() ? "shared_head.head" : "the target's lm_head");
  return os.str();
}

uint64_t MtpLayer::active_bytes_per_token(const Linear& lm_head) const {
  const Linear& head = own_head() ? parts_.head : lm_head;
  return parts_.eh_proj.bytes() + parts_.layer->mixer().active_bytes_per_token() +
         parts_.layer->ffn().active_bytes_per_token() + head.bytes();
}

}  // namespace metrale
