#include "layers/architecture.h"

#include <string>

namespace metrale {

ModelIo Architecture::record(Graph& g, const RecordOptions& o) const {
  const int64_t H = embed.n_in, V = has_head() ? lm_head.n_out() : embed.n_out;
  ModelIo io;
  Tensor injected;
  Residual r{.h = g.buffer("h", H, RowSpace::kRows, BufferKind::kExternal),
             .delta = g.buffer("delta", H, RowSpace::kRows, BufferKind::kExternal)};
  io.h = r.h.buf;
  io.delta = r.delta.buf;
  {
    const Graph::Scope scope(g, "embed");
    g.add(node::Embedding{.table = &embed, .out = r.h});
    if (!lora_overlays.empty())
      g.add(node::TokenOverlay{.h = r.h, .overlays = lora_overlays}, When::kEmbedOverlays);
    // Rows whose embedding the caller computed (image / video features) replace the table's.
    const Tensor all =
        g.buffer("injected", injected_cols(), RowSpace::kInjected, BufferKind::kExternal);
    io.injected = all.buf;
    injected = all;
    g.add(node::InjectRows{.x = all.cols(0, H), .out = r.h}, When::kInjected);
    if (o.observe) g.add(node::Observe{.x = r.h, .index = 0});
  }
  if (o.mrope != nullptr) {
    const Graph::Scope scope(g, "rope");
    // Packed: the rope op reads a table's rows back to back.
    const Tensor cos = g.buffer("cos", o.mrope->half, RowSpace::kRows, BufferKind::kPackedF32);
    const Tensor sin = g.buffer("sin", o.mrope->half, RowSpace::kRows, BufferKind::kPackedF32);
    g.add(node::RopeRows{.cos = cos,
                         .sin = sin,
                         .inv_freq = o.mrope->inv_freq,
                         .axes = o.mrope->axes,
                         .half = o.mrope->half,
                         .scaling = o.mrope->scaling});
    g.set_rope_rows(cos, sin);
  }
  const auto n_layers = static_cast<int32_t>(layers.size());
  for (int32_t i = 0; i < n_layers; ++i) {
    const Graph::Scope scope(g, "layers." + std::to_string(i));
    layers[static_cast<size_t>(i)].record(g, i, r);
    if (i < deepstack) {
      // h (the layer's output, materialised in every pass so the next layer's residual add
      // does not depend on the pass) += deepstack feature i at the injected rows.
      if (r.pending) g.add(node::Add{.x = r.delta, .y = r.h});
      r.pending = false;
      g.add(node::InjectRows{.x = injected.cols(H * (i + 1), H), .out = r.h, .add = true},
            When::kInjected);
    }
    if (o.observe && i + 1 < n_layers) {
      // Materialise h for the observer; the next layer's norm then finds nothing pending.
      if (r.pending) g.add(node::Add{.x = r.delta, .y = r.h});
      r.pending = false;
      g.add(node::Observe{.x = r.h, .index = i + 1});
    }
  }
  // Embeddings: the final norm over the rows the pass pools (a view of them when they are one
  // range), then each pooled output's sum of its rows. No row is both pooled and wanted
  // (Model::step refuses it), so this and the head's in-place residual adds touch different
  // rows of h.
  {
    const Graph::Condition pooled(g, When::kPooled);
    const Graph::Scope scope(g, "pool");
    Residual tail{.h = g.buffer("h", H, RowSpace::kPoolRows),
                  .delta = g.buffer("delta", H, RowSpace::kPoolRows),
                  .pending = r.pending};
    g.add(node::GatherWanted{.x = r.h, .out = tail.h});
    if (tail.pending) g.add(node::GatherWanted{.x = r.delta, .out = tail.delta});
    const Tensor x = g.buffer("x", H, RowSpace::kPoolRows);
    add_and_norm(g, tail, x, final_norm);
    const Tensor sums = g.buffer("sums", H, RowSpace::kPools, BufferKind::kExternal);
    io.pooled = sums.buf;
    g.add(node::SegmentSum{.x = x, .out = sums});
  }
  // The head runs over the wanted rows only (a view of them when they are one range).
  const Graph::Condition wanted(g, When::kWanted);
  const Graph::Scope scope(g, "head");
  Residual tail{.h = g.buffer("h", H, RowSpace::kWanted),
                .delta = g.buffer("delta", H, RowSpace::kWanted),
                .pending = r.pending};
  g.add(node::GatherWanted{.x = r.h, .out = tail.h});
  if (tail.pending) g.add(node::GatherWanted{.x = r.delta, .out = tail.delta});
  const Tensor x = g.buffer("x", H, RowSpace::kWanted);
  add_and_norm(g, tail, x, final_norm);
  if (o.observe) g.add(node::Observe{.x = x, .index = n_layers});
  const Tensor logits = g.buffer("logits", V, RowSpace::kWanted, BufferKind::kExternal);
  io.logits = logits.buf;
  if (!has_head()) return io;  // Model::step asks no logits of it
  lm_head.record(g, x, logits);
  if (!lora_overlays.empty()) {
    g.add(node::HeadOverlay{.x = x, .logits = logits, .overlays = lora_overlays},
          When::kHeadOverlays);
  }
  return io;
}

uint64_t Architecture::active_bytes_per_token() const {
  uint64_t b = 0;
  for (const DecoderLayer& l : layers)
    b += l.mixer().active_bytes_per_token() + l.ffn().active_bytes_per_token();
  return b + lm_head.bytes();
}

LoraSites Architecture::lora_sites() {
  LoraSites out;
  for (DecoderLayer& l : layers) l.lora_sites(out);
  if (has_head()) out.linears.push_back(&lm_head);
  return out;
}

}  // namespace metrale
