// Running a program (program.h): the region each thread runs, its barrier, and a step.
#include "circuit/program.h"

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
#include "circuit/program_instr.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace metrale {

using namespace circuit_detail;

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

void Program::barrier() {
  const uint32_t gen = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    return;
  }
  // Spin a little (a barrier between two kernels is short), then give the core away: the
  // machine may have fewer free cores than threads.
  for (int spin = 0; generation_.load(std::memory_order_acquire) == gen; ++spin) {
    if (spin < 2048) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

Op Program::observed_op(const Instr& in) {
  using K = Instr::Kind;
  switch (in.kind) {
    case K::kAdd:
      return Op::kAdd;
    case K::kGated:
      return Op::kGatedActivation;
    case K::kRope:
      return Op::kRope;
    case K::kNorm:
      return Op::kRmsNorm;
    case K::kKvStore:
      return Op::kKvStore;
    case K::kAttention:
      return Op::kAttention;
    default:  // kLinear, kPrep (serial and pooled ones are bracketed by the backend's op)
      return Op::kLinear;
  }
}

void Program::run_pre_norm(const Instr& in, int t) const {
  // Every thread normalises every row into its own rows, exactly as the norm's kernel does;
  // writes its share of the norm's output (for any later reader); then makes the linear's
  // input from its own rows.
  float* own = private_base_ + static_cast<size_t>(t) * private_stride_;
  RmsNormArgs a = in.norm;
  a.out = Rows{own, a.x.n_rows, a.x.n_cols, in.private_stride};
  cpu::rms_norm_rows(a, 0, a.x.n_rows);
  const auto [c0, c1] = in.part[static_cast<size_t>(t)];
  for (int64_t r = 0; r < a.x.n_rows && c0 < c1; ++r)
    std::copy(a.out.row(r) + c0, a.out.row(r) + c1, in.norm.out.row(r) + c0);
  const ConstRows x{own, a.x.n_rows, a.x.n_cols, in.private_stride};
  if (cpu::reads_bf16_input(*in.w)) {
    cpu::round_rows_bf16(x, 0, x.n_rows, reinterpret_cast<uint16_t*>(own + in.private_input));
  } else if (cpu::quant_input_bytes(*in.w) != 0) {
    cpu::prepare_quant_input(cpu::quant_layout(*in.w), x, 0, x.n_rows, own + in.private_input);
  }
}

void Program::region(int t, const PassInputs& pass, size_t first, size_t last) {
  const auto ut = static_cast<size_t>(t);
  // With an observer on the backend (`bench --profile`), thread 0 brackets each instruction
  // it runs as the op the layer loop would have called, from its start to the start of the next
  // (so a barrier's wait counts to the op whose stragglers it waits for); a serial one is
  // bracketed by the backend op the executor calls.
  OpObserver* const observer = t == 0 ? backend_->observer() : nullptr;
  const Instr* open = nullptr;
  auto close = [&] {
    if (open != nullptr) observer->end(observed_op(*open), open->w);
    open = nullptr;
  };
  for (size_t k = first; k < last; ++k) {
    const Instr& in = code_[k];
    if (in.barrier_before && n_threads_ > 1) barrier();
    if (observer != nullptr) {
      close();
      if (in.kind != Instr::Kind::kSerial && !in.view) {
        open = &in;
        observer->begin(observed_op(in), in.w);
      }
    }
    if (failed_.load(std::memory_order_relaxed)) continue;
    try {
      switch (in.kind) {
        case Instr::Kind::kSerial:
          if (t == 0) exec_->run_node(*backend_, *in.node, pass);
          break;
        case Instr::Kind::kPooled:  // never inside a region (run() runs it between two)
          break;
        case Instr::Kind::kPrep:
          if (t == 0) {
            if (in.prep_bf16) {
              cpu::round_rows_bf16(in.x, 0, in.x.n_rows, reinterpret_cast<uint16_t*>(in.y.data));
            } else {
              cpu::prepare_quant_input(cpu::quant_layout(*in.w), in.x, 0, in.x.n_rows, in.y.data);
            }
          }
          break;
        case Instr::Kind::kLinear: {
          const cpu::LinearJob& job = in.jobs[in.pre_norm ? ut : 0];
          if (in.pre_norm) run_pre_norm(in, t);
          const int64_t end = in.n_claimed;
          for (;;) {
            const int64_t o0 = in.next->fetch_add(in.grain, std::memory_order_relaxed);
            if (o0 >= end) break;
            const int64_t o1 = std::min(end, o0 + in.grain);
            job.run(o0, o1);
            if (in.gate_up) {
              job.run(in.half + o0, in.half + o1);
              const GatedActivationArgs& g = in.gated;
              const GatedActivationArgs piece{
                  .gate = {g.gate.data + o0, g.gate.n_rows, o1 - o0, g.gate.stride},
                  .up = {g.up.data + o0, g.up.n_rows, o1 - o0, g.up.stride},
                  .out = {g.out.data + o0, g.out.n_rows, o1 - o0, g.out.stride},
                  .act = g.act};
              cpu::gated_activation_rows(piece, 0, g.gate.n_rows);
            }
            if (in.add_to.data != nullptr) {
              // The residual add as the norm's (or add's) kernel makes it: h[i] += x[i].
              for (int64_t r = 0; r < in.y.n_rows; ++r) {
                const float* ys = in.y.row(r);
                float* hs = in.add_to.row(r);
                for (int64_t o = o0; o < o1; ++o) hs[o] += ys[o];
              }
            }
          }
          break;
        }
        case Instr::Kind::kAdd: {
          const auto [c0, c1] = in.part[ut];
          for (int64_t r = 0; r < in.x.n_rows; ++r) {
            const float* xs = in.x.row(r);
            float* ys = in.y.row(r);
            for (int64_t i = c0; i < c1; ++i) ys[i] += xs[i];
          }
          break;
        }
        case Instr::Kind::kGated: {
          const auto [c0, c1] = in.part[ut];
          if (c0 >= c1) break;
          const GatedActivationArgs& g = in.gated;
          const GatedActivationArgs piece{
              .gate = {g.gate.data + c0, g.gate.n_rows, c1 - c0, g.gate.stride},
              .up = {g.up.data + c0, g.up.n_rows, c1 - c0, g.up.stride},
              .out = {g.out.data + c0, g.out.n_rows, c1 - c0, g.out.stride},
              .act = g.act};
          cpu::gated_activation_rows(piece, 0, g.gate.n_rows);
          break;
        }
        case Instr::Kind::kRope: {
          const auto [h0, h1] = in.part[ut];
          if (h0 >= h1) break;
          RopeArgs a = in.rope;
          a.positions = pass.positions;
          a.table = pass.rope;
          a.x.data += h0 * a.head_dim;
          a.x.n_cols = (h1 - h0) * a.head_dim;
          a.n_heads = h1 - h0;
          cpu::rope_rows(a, 0, a.x.n_rows);
          break;
        }
        case Instr::Kind::kNorm: {
          const auto [i0, i1] = in.part[ut];
          if (i0 >= i1) break;
          if (!in.norm_groups) {
            cpu::rms_norm_rows(in.norm, i0, i1);
            break;
          }
          RmsNormArgs a = in.norm;
          const int64_t c0 = i0 * a.group, n = (i1 - i0) * a.group;
          a.x = {a.x.data + c0, a.x.n_rows, n, a.x.stride};
          a.out = {a.out.data + c0, a.out.n_rows, n, a.out.stride};
          if (a.gate.data != nullptr) a.gate = {a.gate.data + c0, a.gate.n_rows, n, a.gate.stride};
          cpu::rms_norm_rows(a, 0, a.x.n_rows);
          break;
        }
        case Instr::Kind::kKvStore: {
          const auto [i0, i1] = in.part[ut];
          if (i0 >= i1) break;
          KvStoreArgs a = in.kv;
          a.slots = pass.slots;
          a.cache = pass.kv[static_cast<size_t>(in.layer)];
          cpu::kv_store_items(a, i0, i1);
          break;
        }
        case Instr::Kind::kAttention: {
          const auto [i0, i1] = in.part[ut];
          if (i0 >= i1) break;
          AttentionArgs a = in.attn;
          a.cache = pass.kv[static_cast<size_t>(in.layer)];
          a.seqs = pass.seqs;
          a.row_seq = pass.row_seq;
          a.positions = pass.positions;
          cpu::attention_items(cpu::attention_task(a), in.plan, i0, i1);
          break;
        }
      }
    } catch (...) {
      errors_[ut] = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  if (observer != nullptr) close();
}

void Program::run(const PassInputs& in, float* logits, int64_t logits_stride) {
  METRALE_CHECK(accepts(in), "circuit: a pass of ", in.n_rows, " rows is not the program's ",
                width_, "-row decode step");
  exec_->begin(in);
  // What the split ops take from the pass without the backend op's validation: every layer's
  // KV view, its cache shaped as the program split it, and one slot, position and sequence
  // per row.
  METRALE_CHECK(in.slots.size() == static_cast<size_t>(width_) &&
                    in.positions.size() == static_cast<size_t>(width_) &&
                    in.row_seq.size() == static_cast<size_t>(width_),
                "circuit: a step without a slot, position and sequence per row");
  for (const Instr& i : code_) {
    if (i.layer < 0) continue;
    METRALE_CHECK(static_cast<size_t>(i.layer) < in.kv.size(), "circuit: layer ", i.layer,
                  " has no KV view in the pass");
    const KvLayout& kv = in.kv[static_cast<size_t>(i.layer)].layout;
    METRALE_CHECK(i.kind != Instr::Kind::kKvStore ||
                      (kv.n_kv_heads == i.kv_heads && kv.row_elems() == i.kv.k.n_cols),
                  "circuit: layer ", i.layer, "'s cache has ", kv.n_kv_heads, " kv heads of ",
                  kv.head_dim, ", the program split ", i.kv_heads, " over ", i.kv.k.n_cols,
                  " columns");
  }
  for (Instr& i : code_) {
    if (i.kind != Instr::Kind::kLinear || !i.y_logits) continue;
    // The logits rows are the caller's: only their address changes from step to step.
    const Rows y{logits + i.y_col, i.y.n_rows, i.y.n_cols, logits_stride};
    for (cpu::LinearJob& job : i.jobs) {
      switch (job.kind) {
        case cpu::LinearJob::Kind::kBf16Pairs:
          job.pairs.y = y;
          break;
        case cpu::LinearJob::Kind::kQuant:
          job.quant.y = y;
          break;
        default:
          job.task.y = y;
          break;
      }
    }
  }
  for (Instr& i : code_)
    if (i.next) i.next->store(0, std::memory_order_relaxed);  // published by the dispatch
  size_t begin = 0;
  for (size_t k : pooled_) {
    run_region(in, begin, k);
    // Outside any region: the backend op's parallel_for dispatches to the whole pool.
    exec_->run_node(*backend_, *code_[k].node, in);
    begin = k + 1;
  }
  run_region(in, begin, code_.size());
}

void Program::run_region(const PassInputs& in, size_t begin, size_t end) {
  if (begin >= end) return;
  failed_.store(false, std::memory_order_relaxed);
  backend_->pool().parallel_for(static_cast<size_t>(n_threads_),
                                [&](size_t, size_t, int t) { region(t, in, begin, end); });
  for (std::exception_ptr& e : errors_) {
    if (e) {
      std::exception_ptr first = e;
      for (std::exception_ptr& f : errors_) f = nullptr;
      std::rethrow_exception(first);
    }
  }
}

}  // namespace metrale
