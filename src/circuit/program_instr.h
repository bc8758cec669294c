#pragma once
// What the circuit's three source files share (program.cc: compiling a graph into a program;
// program_barriers.cc: where the barriers go; program_run.cc: running a step in the region):
// the instruction and memory-access records and the analysis's helpers. Internal to
// metrale_circuit.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <thread>
#include <type_traits>
#include <variant>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/linear_pairs.h"
#include "backend/cpu/linear_quant.h"
#include "circuit/program.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace metrale {
namespace circuit_detail {

// Memory regions the barrier analysis tells apart: real memory by address (the arena, the
// residual stream, the program's scratch), the logits by offset (their rows come per step),
// and each layer's KV pages and recurrent state as one unit each.
inline constexpr int64_t kMemory = 0;
inline constexpr int64_t kLogits = 1;
inline int64_t kv_region(int32_t layer) { return 2 + 2 * int64_t{layer}; }
inline int64_t state_region(int32_t layer) { return 3 + 2 * int64_t{layer}; }

// Whether a norm's groups (per-head qk-norm) split: each group is normalised alone, so a thread
// may take whole groups of every row.
inline bool norm_by_groups(const node::RmsNorm& n) {
  return n.group > 0 && n.group < n.x.n_cols && n.x.n_cols % n.group == 0 && !n.residual.valid();
}

// Whether a norm splits at all: by groups, or by rows when the step has more than one (a row's
// sum of squares is one thread's, in the kernel's order).
inline bool norm_splits(const node::RmsNorm& n, int64_t width) {
  return norm_by_groups(n) || width > 1;
}

// Whether a node the program does not partition is big enough, and split by its backend op
// over the pool, that running it between two regions with every thread (kPooled) beats running
// it on thread 0 alone: MoE's experts, the delta rule, latent attention, MLA's per-head
// products, and an attention the program does not split.
inline bool splits_itself(const Node& n) {
  return std::holds_alternative<node::Moe>(n.args) ||
         std::holds_alternative<node::DeltaRule>(n.args) ||
         std::holds_alternative<node::LatentAttention>(n.args) ||
         std::holds_alternative<node::Linears>(n.args) ||
         std::holds_alternative<node::Attention>(n.args);
}

}  // namespace circuit_detail

// Bytes one thread touches: rows [0, n_rows) of `stride` bytes from `base`, bytes [c0, c1) of
// each.
struct Program::Access {
  int64_t region = circuit_detail::kMemory;
  uintptr_t base = 0;
  int64_t stride = 0;
  int64_t n_rows = 0;
  int64_t c0 = 0, c1 = 0;
  bool write = false;
  int thread = 0;

  bool overlaps(const Access& o) const {
    if (region != o.region || n_rows == 0 || o.n_rows == 0) return false;
    const auto a0 = static_cast<int64_t>(base) + c0, a1 = static_cast<int64_t>(base) + c1;
    const auto b0 = static_cast<int64_t>(o.base) + o.c0, b1 = static_cast<int64_t>(o.base) + o.c1;
    if (stride == o.stride) {
      // Rows of the same stride: row i of this, [a0, a1) + i * stride, against row j of the
      // other; only j - i matters (column ranges of one buffer's rows never collide).
      for (int64_t k = -(n_rows - 1); k <= o.n_rows - 1; ++k) {
        if (b0 + k * stride < a1 && a0 < b1 + k * stride) return true;
      }
      return false;
    }
    return a0 < b1 + (o.n_rows - 1) * o.stride && b0 < a1 + (n_rows - 1) * stride;
  }
};

struct Program::Instr {
  enum class Kind : uint8_t {
    kSerial,     // thread 0: the executor runs `node`
    kPooled,     // between two regions: the executor runs `node` on the caller's thread, the
                 // backend op splitting it over every thread of the pool as in the layer loop
    kPrep,       // thread 0: a linear's input as its kernel reads it, into the scratch
    kLinear,     // every thread: outputs part[t] of `job`
    kAdd,        // every thread: columns part[t] of y += x
    kGated,      // every thread: columns part[t] of out = act(gate) * up
    kRope,       // every thread: heads part[t] of every row
    kNorm,       // every thread: groups part[t] of every row (norm_groups), or rows part[t]
    kKvStore,    // every thread: items part[t] (kv heads x rows, head-major)
    kAttention,  // every thread: items part[t] of the call's AttentionPlan
  };
  Kind kind = Kind::kSerial;
  const Node* node = nullptr;
  bool barrier_before = false;
  bool view = false;  // a GatherWanted the executor makes a view: it touches no memory
  // kPrep / kLinear
  const WeightTensor* w = nullptr;
  ConstRows x{};
  Rows y{};
  bool y_logits = false;  // y is the logits: its rows come per step (from column y_col)
  int64_t y_col = 0;
  bool prep_bf16 = false;
  size_t scratch_offset = 0;  // bytes into the scratch: kPrep writes, kLinear reads
  // kLinear: one job, or one per thread when it runs a norm first (each reads its thread's
  // own rows).
  std::vector<cpu::LinearJob> jobs;
  bool pre_norm = false;       // norm fusion: `norm` into the thread's own rows first
  int64_t private_stride = 0;  // of those rows
  size_t private_input = 0;    // floats of them; the kernel's input (bf16, quantized) follows
  Rows add_to{};               // residual fusion: add_to[r][o] += y[r][o] after each piece
  bool gate_up = false;        // gate_up fusion: outputs o and half + o, then gated
  int64_t half = 0;
  int64_t n_claimed = 0;      // outputs claimed: n_out, or half
  std::string label;          // the fused ops, for describe()
  std::unique_ptr<Node> own;  // the node as it runs when a fusion changed it (a norm's residual)
  // kLinear: the threads claim pieces of `grain` outputs from `next` as they go (the backend's
  // split: a thread the machine slows takes fewer), so every thread may write any output.
  int64_t grain = 0;
  std::unique_ptr<std::atomic<int64_t>> next;
  // kAdd / kGated
  GatedActivationArgs gated{};
  // kRope / kNorm / kKvStore / kAttention: the op's arguments resolved at compile time; what
  // varies per step (positions, slots, the KV view, the sequences) is filled in by each thread.
  RopeArgs rope{};
  RmsNormArgs norm{};
  bool norm_groups = false;
  KvStoreArgs kv{};
  AttentionArgs attn{};
  int32_t layer = -1;
  int64_t kv_heads = 0;  // kKvStore: the layer cache's
  cpu::AttentionPlan plan;
  std::vector<cpu::AttentionRowSpan> spans;
  std::vector<std::pair<int64_t, int64_t>> part;  // [threads] outputs / columns of thread t
};

}  // namespace metrale
