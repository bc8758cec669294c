#pragma once
// What one forward pass hands every layer (ForwardContext), what each layer keeps per
// sequence (LayerState), and the residual stream the layers pass along.
//
// A pass is ragged: n_rows rows, each a token of some sequence. A prefill chunk is many rows
// of one sequence, a decode step one row of each of many sequences, a verify of k draft
// tokens k rows of one sequence, and one pass may mix all three. The rows of a sequence are
// consecutive and are its newest tokens. The engine fills the per-row metadata; layers never
// look at sequences or pages themselves.
#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace metrale {

struct ForwardContext {
  Backend* backend = nullptr;
  int64_t n_rows = 0;
  std::span<const int32_t> positions;  // [n_rows] position of each row in its sequence
  std::span<const int32_t> row_seq;    // [n_rows] index of each row's sequence in `seqs`
  std::span<const int64_t> slots;      // [n_rows] KV slot each row's K/V is stored to
  // [n_rows] recurrent-state slot of each row's sequence (-1: none; hybrid models) and LoRA
  // slot of each row (-1: base weights only). Empty spans mean all -1.
  std::span<const int32_t> state_slots;
  std::span<const int32_t> lora_slots;
  // The pass's sequences; seq_len counts every stored token, this pass's rows included.
  std::span<const KvPageTable> seqs;
  RopeCache rope;
};

// A layer's per-sequence state lives in pools the engine owns; this is the layer's view:
// its KV pages (attention layers), or where its conv and SSM state sit in the pass's state
// blocks (Gated DeltaNet layers; engine/state_pool.h).
struct LayerState {
  KvLayerView kv;
  StateSlice conv;
  StateSlice ssm;
};

// The residual stream h, plus the output of the previous sub-block (`delta`) still to be
// added. Deferring the add lets the next RMSNorm fuse it (h += delta; x = norm(h)), the way
// HF's `hidden_states = residual + hidden_states` is followed by a norm.
struct Residual {
  Rows h;      // [n_rows, hidden]
  Rows delta;  // [n_rows, hidden]
  bool pending = false;
};

}  // namespace metrale
