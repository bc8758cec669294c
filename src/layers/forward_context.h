#pragma once
// What one forward pass hands every layer (ForwardContext), what each layer keeps per
// sequence (LayerState), and the residual stream the layers pass along.
//
// One pass is either a decode step (one row per sequence, any number of sequences) or a
// prefill chunk (the next n_rows tokens of one sequence). Per-row metadata (positions, KV
// slots) is filled by the engine; layers never look at sequences or pages themselves.
#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace metrale {

struct ForwardContext {
  Backend* backend = nullptr;
  int64_t n_rows = 0;
  std::span<const int32_t> positions;  // [n_rows] position of each row in its sequence
  std::span<const int64_t> slots;      // [n_rows] KV slot each row's K/V is stored to
  // Decode: seqs[i] is row i's sequence. Prefill: seqs holds the one sequence, whose last
  // n_rows tokens are this chunk. seq_len counts the rows of this pass too.
  std::span<const KvPageTable> seqs;
  bool prefill = false;
  const RopeTable* rope = nullptr;
};

// A layer's per-sequence state lives in pools the engine owns; this is the layer's view.
struct LayerState {
  KvLayerView kv;
};

// The residual stream h, plus the output of the previous sub-block (`delta`) still to be
// added. Deferring the add lets the next RMSNorm fuse it (h += delta; x = norm(h)), the way
// HF's `hidden_states = residual + hidden_states` is followed by a norm.
struct Residual {
  Rows h;      // [n_rows, hidden]
  Rows delta;  // [n_rows, hidden]
  bool pending = false;
};

// Adds a pending delta and normalises: out = norm(h += delta), or out = norm(h).
inline void add_and_norm(Backend& backend, Residual& r, Rows out, const float* weight, float eps,
                         NormStyle style) {
  RmsNormArgs a{.x = r.pending ? ConstRows(r.delta) : ConstRows(r.h),
                .out = out,
                .weight = weight,
                .eps = eps,
                .style = style};
  if (r.pending) a.residual = r.h;
  backend.rms_norm(a);
  r.pending = false;
}

}  // namespace metrale
