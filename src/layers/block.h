#pragma once
// The blocks a decoder layer is composed of. A layer is norm -> mixer -> norm -> FFN (see
// decoder_layer.h); a family picks the mixer and the FFN of each layer. New kinds (Gated
// DeltaNet, MLA, a shared-expert MoE) are new implementations of these two interfaces.
//
// A block does not run: it records the backend ops it is made of into a Graph (graph/graph.h)
// over buffers it declares there, once at load. The layer loop runs the recorded graph op by
// op; the circuit compiler reads the same nodes. What varies per pass (positions, KV slots,
// recurrent-state blocks, LoRA slots) is bound when the graph runs, never seen by a block.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "io/config/model_config.h"

namespace metrale {

// A mixer's recurrent state per sequence (Gated DeltaNet): the conv window and the SSM state.
struct LayerStateShape {
  int64_t conv_elems = 0;  // (K - 1) * conv channels
  int64_t ssm_elems = 0;   // n_v_heads * k_head_dim * v_head_dim
  bool empty() const { return conv_elems == 0 && ssm_elems == 0; }
};

class Linear;

// What a block records for: its input rows [rows, hidden], the rows its output (the
// residual's delta) goes to, and its layer's index (whose KV pages and recurrent state the
// pass binds).
struct BlockIo {
  Tensor x;
  Tensor out;
  int32_t layer = 0;
};

// What a LoRA pool (lora/lora_pool.h) may attach to in a block: its linears whose parts are the
// checkpoint's modules (PEFT names them the same), and an MoE layer's experts.
struct ExpertLoraSite {
  std::string prefix;  // "model.layers.0.mlp.experts"
  int64_t n_experts = 0, hidden = 0, intermediate = 0;
  const LoraWeights** gate_up = nullptr;  // where the block reads its experts' LoRA from
  const LoraWeights** down = nullptr;
};
struct LoraSites {
  std::vector<Linear*> linears;
  std::vector<ExpertLoraSite> experts;
};

// Mixes information across the tokens of a sequence (attention, linear attention).
class Mixer {
 public:
  virtual ~Mixer() = default;
  // Records the mixer's ops: io.x the normed rows, io.out the residual's delta.
  virtual void record(Graph& g, const BlockIo& io) const = 0;
  // One line for `metrale inspect` ("attention: 32 heads / 4 kv, head_dim 128, qk-norm").
  virtual std::string describe() const = 0;
  // Weight bytes one token reads.
  virtual uint64_t active_bytes_per_token() const = 0;
  // The recurrent state it keeps per sequence, in elements (zero: none, e.g. attention).
  virtual LayerStateShape state_shape() const { return {}; }
  // What it keeps per token in the paged KV cache (empty: nothing, e.g. Gated DeltaNet).
  virtual KvShape kv_shape() const { return {}; }
  // Adds what LoRA may adapt (none: a mixer whose projections are not the checkpoint's
  // modules one to one, e.g. MLA's absorbed kv_b_proj, or not tested against PEFT yet).
  virtual void lora_sites(LoraSites& /*out*/) {}
};

// Transforms each row on its own (dense MLP, mixture of experts).
class Ffn {
 public:
  virtual ~Ffn() = default;
  virtual void record(Graph& g, const BlockIo& io) const = 0;
  virtual std::string describe() const = 0;
  // Weight bytes one token reads (for the active-bytes roofline): all of a dense MLP, the
  // router and top-k experts of an MoE.
  virtual uint64_t active_bytes_per_token() const = 0;
  virtual void lora_sites(LoraSites& /*out*/) {}
};

}  // namespace metrale
