#pragma once
// The circuit's fusion policy (`--fusion`): which pairs of recorded ops the compiler may run as
// one instruction, so a step makes one pass over the data and needs fewer barriers.
//  - residual: a residual add (an Add node, or the residual half of an RmsNorm node) folded into
//    the epilogue of the linear that produces its operand (o_proj, down_proj): each thread adds
//    the outputs it just computed into the residual stream;
//  - gate_up: act(gate) * up folded into the epilogue of the one gate|up linear (Ffn's fused
//    gate_proj + up_proj): a thread computes gate outputs [o0, o1) and up outputs [I + o0,
//    I + o1) together, then their product;
//  - norm: a whole-row RMSNorm (after `residual` took its residual add) folded into the next
//    linear's input pass: every thread normalises the rows itself into its own buffer (and
//    writes its share of the norm's output for any other reader), then computes its outputs.
// Every fusion keeps each output's arithmetic the unfused ops' (the same operands, kernel and
// order), so with any policy the logits equal the layer loop's bit for bit; the tolerance the
// tests state for the default policy (f32: 1e-5 relative) is what a later, non-exact fusion
// must stay within. A pair that cannot be formed for a node runs unfused, and the program says
// so (Program::fusion_notes).
#include <string>
#include <string_view>

namespace metrale {

struct FusionPolicy {
  bool residual = false;
  bool gate_up = false;
  bool norm = false;

  bool any() const { return residual || gate_up || norm; }
  static FusionPolicy all() { return {.residual = true, .gate_up = true, .norm = true}; }
};

// "none" (the layer loop's exact ops), "default" (every fusion above), or a comma-separated list
// of residual, gate_up, norm; anything else throws an Error naming `flag` and the valid names.
FusionPolicy parse_fusion(std::string_view text, std::string_view flag = "--fusion");
// "none", "default" or the list, as parse_fusion reads it.
std::string fusion_name(const FusionPolicy& p);

}  // namespace metrale
