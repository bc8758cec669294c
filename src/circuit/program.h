#pragma once
// The circuit executor: a recorded Graph (graph/graph.h) compiled, at load, into one Program per
// decode batch width — a flat list of instructions whose pointers (into the planned arena and
// the weights), shapes, kernels and per-thread partitions are resolved once — run inside ONE
// parallel region of the CPU backend's thread pool, with a barrier only where the data needs one.
//
// What a program is for: a decode step of `width` rows, each row one sequence's single newest
// token and each wanting its logits, with no LoRA row, no injected embedding, no pooling and no
// observer. Program::accepts says whether a pass is one; anything else (prefill chunks, verify
// rows, other widths, LoRA) runs the layer loop (Executor).
//
// Instructions come in two forms:
//  - partitioned: a linear layer (the threads claim pieces of 16-output units as they go, as
//    the backend's linear does: a thread the machine slows takes fewer; each piece the
//    backend's LinearJob), the elementwise add / gated activation (each thread a fixed range
//    of 16-column units), rope (whole heads of every row), rms_norm (whole groups of a
//    per-head norm, or whole rows when the step has several), the KV store (whole kv heads of
//    every row: cpu::kv_store_items) and attention (a static range of the call's
//    AttentionPlan items: cpu::attention_items, kv head outermost). Each output's arithmetic is
//    the backend kernel's, so the results equal the layer loop's bit for bit whatever the split;
//  - serial: every other small node (a whole-row norm at width 1, the embedding, the router,
//    ...), run on thread 0 through the executor's call of the backend op (its own parallel_for
//    runs inline there), exactly as the layer loop runs it;
//  - pooled: the nodes whose backend op is big and splits itself (MoE experts, the delta rule,
//    latent attention, MLA's per-head products): the region ends before one, the caller's
//    thread runs it through the executor with the whole pool (the layer loop's op and split,
//    so the same bits), and a new region starts after it. With more than one thread; at one
//    such a node is serial.
// A fusion policy (circuit/fusion.h) may fold a residual add, a gated activation or a norm into
// the linear next to it; the ops' arithmetic stays the same.
// A barrier is put before an instruction only when one of its threads touches bytes (of the
// arena, an external buffer, a layer's KV pages (per kv head) or recurrent state, or the
// program's scratch) that another thread touched since the last barrier, one of the two a
// write: a serial op after a serial op needs none (same thread), nor an op whose heads or
// columns are split as its producer's were (qk-norm -> rope -> KV store -> attention, per head).
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/linear_job.h"
#include "circuit/fusion.h"
#include "graph/executor.h"
#include "graph/graph.h"
#include "graph/plan.h"

namespace metrale {

class CpuBackend;

// Which executor runs decode steps (`--executor`).
enum class ExecutorKind : uint8_t { kLayers, kCircuit };
// "layers" / "circuit"; anything else throws an Error naming `flag` and the values.
ExecutorKind parse_executor(std::string_view text, std::string_view flag = "--executor");
std::string_view executor_name(ExecutorKind kind);

// The external buffers of the graph the program reads or writes: fixed memory (the residual
// stream) and the logits, whose rows the caller hands per step.
struct ProgramIo {
  BufferId logits = -1;
};

class Program {
 public:
  struct Stats {
    int64_t width = 0;
    int64_t instructions = 0;
    int64_t partitioned = 0;  // instructions every thread runs a share of
    int64_t serial = 0;       // instructions thread 0 runs alone
    int64_t pooled = 0;       // instructions run between two regions over the whole pool
    int64_t barriers = 0;     // per step: inside regions, each region's end, each pooled op's join
    // The barriers were rope, rms_norm, kv_store and attention run on thread 0 (as before they
    // split): what splitting them saved or cost.
    int64_t barriers_unsplit = 0;
    int64_t split_ops = 0;  // of the partitioned: rope, rms_norm, kv_store and attention
    // The layer loop's pool dispatches per step for the same pass: one per op it runs, each
    // ending in a join (a barrier).
    int64_t layer_dispatches = 0;
    size_t workspace_bytes = 0;  // the arena's bytes plus the program's input scratch
    // Fusions taken (circuit/fusion.h), and candidates the policy allowed that ran unfused.
    int64_t fused_residual = 0, fused_gate_up = 0, fused_norm = 0, not_fused = 0;
  };

  // Compiles `graph` (planned as `plan`, whose nodes `exec` runs over `arena`) for decode steps
  // of `width` rows on `backend`'s pool. The externals other than io.logits must already be
  // bound on `exec` to the memory every step uses. Never fails for a graph the layer loop runs:
  // a node it cannot partition runs serially.
  // `fusion`: the pairs it may fuse (circuit/fusion.h); none: the layer loop's exact ops.
  Program(const Graph& graph, const GraphPlan& plan, Executor& exec, CpuBackend& backend,
          int64_t width, ProgramIo io, FusionPolicy fusion = {});
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // Whether `in` is a pass this program runs (see the top of this file).
  bool accepts(const PassInputs& in) const;
  // Runs one step: `in` as accepts() took it, `logits` [width, vocab] the logits rows.
  void run(const PassInputs& in, float* logits, int64_t logits_stride);

  const Stats& stats() const { return stats_; }
  // One line per instruction (kind, scope, partition, barrier before it).
  std::string describe() const;
  // One line per candidate pair the policy allowed that this program runs unfused, and why.
  const std::vector<std::string>& fusion_notes() const { return notes_; }
  const FusionPolicy& fusion() const { return fusion_; }

 private:
  struct Instr;
  struct Access;
  void add_accesses(const Instr& in, std::vector<Access>& out, bool unsplit) const;
  // Marks barrier_before where the accesses need one (unsplit: only counts them, the split ops
  // taken as serial); returns how many.
  int64_t place_barriers(bool unsplit);
  // Thread t's share of code_[first, last) (no pooled instruction among them).
  void region(int t, const PassInputs& in, size_t first, size_t last);
  // code_[begin, end) in one parallel region of the pool; rethrows what a thread threw.
  void run_region(const PassInputs& in, size_t begin, size_t end);
  void run_pre_norm(const Instr& in, int t) const;
  // The backend op an instruction stands for in a profile (a linear's input prep counts to
  // the linear, as it does inside the backend's linear; fused epilogues count to their linear).
  static Op observed_op(const Instr& in);
  void barrier();

  const Graph* graph_;
  Executor* exec_;
  CpuBackend* backend_;
  int64_t width_ = 0;
  int n_threads_ = 1;
  ProgramIo io_;
  FusionPolicy fusion_;
  std::vector<std::string> notes_;
  std::vector<Instr> code_;
  std::vector<size_t> pooled_;  // indices of the kPooled instructions, in order
  std::vector<float> scratch_;  // linear inputs as their kernels read them (bf16, quantized)
  uintptr_t scratch_base_ = 0;  // its 64-byte aligned start
  // Each thread's own rows for the norm fusion (the normalised rows and their kernel input).
  std::vector<float> private_;
  size_t private_stride_ = 0;  // floats per thread
  float* private_base_ = nullptr;
  std::vector<float*> base_;  // [buffers] where each buffer's rows start in a step
  Stats stats_;
  // The region's barrier (sense-reversing, spinning then yielding) and its failure state.
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  std::atomic<bool> failed_{false};
  std::vector<std::exception_ptr> errors_;  // [threads]
};

}  // namespace metrale
