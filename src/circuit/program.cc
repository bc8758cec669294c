#include "circuit/program.h"

#include <algorithm>
#include <cstdio>
#include <thread>
#include <type_traits>
#include <variant>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/linear_pairs.h"
#include "backend/cpu/linear_quant.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Memory regions the barrier analysis tells apart: real memory by address (the arena, the
// residual stream, the program's scratch), the logits by offset (their rows come per step),
// and each layer's KV pages and recurrent state as one unit each.
constexpr int64_t kMemory = 0;
constexpr int64_t kLogits = 1;
int64_t kv_region(int32_t layer) { return 2 + 2 * int64_t{layer}; }
int64_t state_region(int32_t layer) { return 3 + 2 * int64_t{layer}; }

}  // namespace

ExecutorKind parse_executor(std::string_view text, std::string_view flag) {
  if (text == "layers") return ExecutorKind::kLayers;
  if (text == "circuit") return ExecutorKind::kCircuit;
  throw Error(std::string(flag) + ": expected layers or circuit, found '" + std::string(text) +
              "'");
}

std::string_view executor_name(ExecutorKind kind) {
  return kind == ExecutorKind::kCircuit ? "circuit" : "layers";
}

// Bytes one thread touches: rows [0, n_rows) of `stride` bytes from `base`, bytes [c0, c1) of
// each.
struct Program::Access {
  int64_t region = kMemory;
  uintptr_t base = 0;
  int64_t stride = 0;
  int64_t n_rows = 0;
  int64_t c0 = 0, c1 = 0;
  bool write = false;
  int thread = 0;

  bool overlaps(const Access& o) const {
    if (region != o.region || n_rows == 0 || o.n_rows == 0) return false;
    if (base == o.base && stride == o.stride) return c0 < o.c1 && o.c0 < c1;
    const uintptr_t a0 = base + static_cast<uintptr_t>(c0);
    const uintptr_t a1 = base + static_cast<uintptr_t>((n_rows - 1) * stride + c1);
    const uintptr_t b0 = o.base + static_cast<uintptr_t>(o.c0);
    const uintptr_t b1 = o.base + static_cast<uintptr_t>((o.n_rows - 1) * o.stride + o.c1);
    return a0 < b1 && b0 < a1;
  }
};

struct Program::Instr {
  enum class Kind : uint8_t {
    kSerial,  // thread 0: the executor runs `node`
    kPrep,    // thread 0: a linear's input as its kernel reads it, into the scratch
    kLinear,  // every thread: outputs part[t] of `job`
    kAdd,     // every thread: columns part[t] of y += x
    kGated,   // every thread: columns part[t] of out = act(gate) * up
  };
  Kind kind = Kind::kSerial;
  const Node* node = nullptr;
  bool barrier_before = false;
  // kPrep / kLinear
  const WeightTensor* w = nullptr;
  ConstRows x{};
  Rows y{};
  bool y_logits = false;  // y is the logits: its rows come per step (from column y_col)
  int64_t y_col = 0;
  bool prep_bf16 = false;
  size_t scratch_offset = 0;  // bytes into the scratch: kPrep writes, kLinear reads
  cpu::LinearJob job;
  // kLinear: the threads claim pieces of `grain` outputs from `next` as they go (the backend's
  // split: a thread the machine slows takes fewer), so every thread may write any output.
  int64_t grain = 0;
  std::unique_ptr<std::atomic<int64_t>> next;
  // kAdd / kGated
  GatedActivationArgs gated{};
  std::vector<std::pair<int64_t, int64_t>> part;  // [threads] outputs / columns of thread t
};

Program::~Program() = default;

Program::Program(const Graph& graph, const GraphPlan& plan, Executor& exec, CpuBackend& backend,
                 int64_t width, ProgramIo io)
    : graph_(&graph),
      exec_(&exec),
      backend_(&backend),
      width_(width),
      n_threads_(backend.pool().size()),
      io_(io) {
  METRALE_CHECK(width >= 1 && width <= plan.max_rows, "circuit: a program of ", width,
                " rows for a graph planned for ", plan.max_rows);
  const size_t n_buf = graph.buffers().size();
  // Where each buffer's rows start in this program's steps (a GatherWanted view shares its
  // source's), as the executor will find them.
  std::vector<float*>& base = base_;
  base.resize(n_buf);
  for (size_t b = 0; b < n_buf; ++b) base[b] = exec.memory(static_cast<BufferId>(b));
  auto n_rows_of = [&](const Tensor& t) -> int64_t {
    const RowSpace r = graph.buffer_decl(t.buf).rows;
    return r == RowSpace::kRows || r == RowSpace::kWanted ? width : 0;
  };
  auto rows_of = [&](const Tensor& t) {
    // The logits' rows come per step (Program::run): until then, no address.
    if (t.buf == io.logits) return Rows{nullptr, n_rows_of(t), t.n_cols, t.n_cols};
    return Rows{base[static_cast<size_t>(t.buf)] + t.col, n_rows_of(t), t.n_cols,
                exec.stride(t.buf)};
  };
  auto partition = [&](int64_t n_out, int64_t unit_multiple) {
    const int64_t step = cpu::kLinearUnit * unit_multiple;
    const int64_t groups = (n_out + step - 1) / step;
    std::vector<std::pair<int64_t, int64_t>> part(static_cast<size_t>(n_threads_));
    for (int t = 0; t < n_threads_; ++t) {
      size_t gb, ge;
      ThreadPool::chunk_range(static_cast<size_t>(groups), n_threads_, t, &gb, &ge);
      part[static_cast<size_t>(t)] = {std::min(n_out, static_cast<int64_t>(gb) * step),
                                      std::min(n_out, static_cast<int64_t>(ge) * step)};
    }
    return part;
  };

  size_t scratch_bytes = 0;
  for (const Node& node : graph.nodes()) {
    // A decode step asks for logits and nothing else a condition names.
    if ((static_cast<uint8_t>(node.when) & ~static_cast<uint8_t>(When::kWanted)) != 0) continue;
    ++stats_.layer_dispatches;
    Instr in;
    in.node = &node;
    if (const auto* n = std::get_if<node::Linear>(&node.args)) {
      in.kind = Instr::Kind::kLinear;
      in.w = n->w;
      in.x = rows_of(n->x);
      in.y = rows_of(n->y);
      in.y_logits = n->y.buf == io.logits;
      in.y_col = n->y.col;
      const int64_t bytes = in.x.n_rows * cpu::quant_input_bytes(*n->w);
      const bool bf16 = cpu::reads_bf16_input(*n->w);
      if (bf16 || bytes != 0) {
        Instr prep;
        prep.node = &node;
        prep.w = in.w;
        prep.x = in.x;
        prep.kind = Instr::Kind::kPrep;
        prep.prep_bf16 = bf16;
        prep.scratch_offset = scratch_bytes;
        in.scratch_offset = scratch_bytes;
        const auto need = static_cast<size_t>(
            bf16 ? in.x.n_rows * in.x.n_cols * static_cast<int64_t>(sizeof(uint16_t)) : bytes);
        scratch_bytes += (need + 63) / 64 * 64;
        code_.push_back(std::move(prep));
      }
      // The kernel's piece size (the pairs kernel takes whole tile groups).
      const int64_t multiple = bf16 ? cpu::kPairsTileGroups : 1;
      const int64_t units = (n->w->n_out + cpu::kLinearUnit - 1) / cpu::kLinearUnit;
      int64_t grain = std::max<int64_t>(1, units / (n_threads_ * 8));
      grain = (grain + multiple - 1) / multiple * multiple;
      in.grain = grain * cpu::kLinearUnit;
      in.next = std::make_unique<std::atomic<int64_t>>(0);
    } else if (const auto* a = std::get_if<node::Add>(&node.args);
               a != nullptr && a->y.buf != io.logits) {
      in.kind = Instr::Kind::kAdd;
      in.x = rows_of(a->x);
      in.y = rows_of(a->y);
      in.part = partition(a->x.n_cols, 1);
    } else if (const auto* g = std::get_if<node::GatedActivation>(&node.args);
               g != nullptr && g->out.buf != io.logits) {
      in.kind = Instr::Kind::kGated;
      in.gated = {
          .gate = rows_of(g->gate), .up = rows_of(g->up), .out = rows_of(g->out), .act = g->act};
      in.part = partition(g->gate.n_cols, 1);
    } else if (const auto* gw = std::get_if<node::GatherWanted>(&node.args)) {
      // The executor makes the wanted rows a view of x when they are one range from row 0,
      // which every accepted step's are (all its rows want logits).
      const auto x = static_cast<size_t>(gw->x.buf), out = static_cast<size_t>(gw->out.buf);
      if (gw->x.col == 0 && gw->out.col == 0 &&
          exec.stride(gw->x.buf) == exec.stride(gw->out.buf) &&
          graph.buffer_decl(gw->out.buf).rows == RowSpace::kWanted) {
        base[out] = base[x];
        --stats_.layer_dispatches;  // the layer loop dispatches nothing for a view either
      }
    }
    code_.push_back(std::move(in));
  }
  scratch_.resize((scratch_bytes + sizeof(float) - 1) / sizeof(float) + 16);
  auto* scratch =
      reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(scratch_.data()) + 63) / 64 * 64);
  scratch_base_ = reinterpret_cast<uintptr_t>(scratch);
  for (Instr& in : code_) {
    if (in.kind != Instr::Kind::kLinear) continue;
    const bool bf16 = cpu::reads_bf16_input(*in.w);
    const bool quant = cpu::quant_input_bytes(*in.w) != 0;
    in.job = cpu::make_linear_job(
        in.x, bf16 ? reinterpret_cast<const uint16_t*>(scratch + in.scratch_offset) : nullptr,
        *in.w, in.y, quant ? scratch + in.scratch_offset : nullptr);
  }
  for (Instr& in : code_) {
    if (in.kind == Instr::Kind::kPrep)
      in.y = Rows{reinterpret_cast<float*>(scratch + in.scratch_offset), 0, 0, 0};
  }

  // Barriers: before an instruction one of whose threads touches what another thread touched
  // since the last barrier (one of them writing).
  std::vector<Access> since, mine;
  for (Instr& in : code_) {
    mine.clear();
    add_accesses(in, mine);
    bool conflict = false;
    for (const Access& a : mine) {
      for (const Access& s : since) {
        if (a.thread != s.thread && (a.write || s.write) && a.overlaps(s)) {
          conflict = true;
          break;
        }
      }
      if (conflict) break;
    }
    if (conflict) {
      in.barrier_before = true;
      ++stats_.barriers;
      since.clear();
    }
    since.insert(since.end(), mine.begin(), mine.end());
    if (in.kind == Instr::Kind::kSerial || in.kind == Instr::Kind::kPrep) {
      ++stats_.serial;
    } else {
      ++stats_.partitioned;
    }
  }
  if (n_threads_ > 1) ++stats_.barriers;  // the region's end (the pool's join)
  stats_.width = width;
  stats_.instructions = static_cast<int64_t>(code_.size());
  stats_.workspace_bytes = plan.arena_bytes + scratch_bytes;
  errors_.resize(static_cast<size_t>(n_threads_));
}

void Program::add_accesses(const Instr& in, std::vector<Access>& out) const {
  // Columns [c0, c1) of rows r; the logits (no address yet) by their offset, from column
  // logits_col.
  auto rows_access = [&](const Rows& r, bool logits, bool write, int t, int64_t c0, int64_t c1,
                         int64_t logits_col = 0) {
    Access a;
    a.region = logits ? kLogits : kMemory;
    a.base = logits ? static_cast<uintptr_t>(logits_col) * sizeof(float)
                    : reinterpret_cast<uintptr_t>(r.data);
    a.stride = r.stride * static_cast<int64_t>(sizeof(float));
    a.n_rows = r.n_rows;
    a.c0 = c0 * static_cast<int64_t>(sizeof(float));
    a.c1 = c1 * static_cast<int64_t>(sizeof(float));
    a.write = write;
    a.thread = t;
    out.push_back(a);
  };
  auto scratch_access = [&](size_t offset, bool write, int t) {
    Access a;
    a.region = kMemory;
    a.base = scratch_base_;
    a.n_rows = 1;
    a.c0 = static_cast<int64_t>(offset);
    a.c1 = static_cast<int64_t>(offset) + 1;  // a prep's bytes start at its offset
    a.write = write;
    a.thread = t;
    out.push_back(a);
  };
  switch (in.kind) {
    case Instr::Kind::kLinear:
      for (int t = 0; t < n_threads_; ++t) {
        // Claimed dynamically: any thread may write any output.
        const int64_t o0 = 0, o1 = in.w->n_out;
        if (cpu::reads_bf16_input(*in.w) || cpu::quant_input_bytes(*in.w) != 0) {
          scratch_access(in.scratch_offset, false, t);
        } else {
          rows_access(Rows{const_cast<float*>(in.x.data), in.x.n_rows, in.x.n_cols, in.x.stride},
                      false, false, t, 0, in.x.n_cols);
        }
        // Rows resolved relative to the tensor's first column: columns [o0, o1) of y.
        rows_access(in.y, in.y_logits, true, t, o0, o1, in.y_col);
      }
      return;
    case Instr::Kind::kPrep:
      rows_access(Rows{const_cast<float*>(in.x.data), in.x.n_rows, in.x.n_cols, in.x.stride}, false,
                  false, 0, 0, in.x.n_cols);
      scratch_access(in.scratch_offset, true, 0);
      return;
    case Instr::Kind::kAdd:
      for (int t = 0; t < n_threads_; ++t) {
        const auto [c0, c1] = in.part[static_cast<size_t>(t)];
        if (c0 >= c1) continue;
        rows_access(Rows{const_cast<float*>(in.x.data), in.x.n_rows, in.x.n_cols, in.x.stride},
                    false, false, t, c0, c1);
        rows_access(in.y, false, true, t, c0, c1);
      }
      return;
    case Instr::Kind::kGated:
      for (int t = 0; t < n_threads_; ++t) {
        const auto [c0, c1] = in.part[static_cast<size_t>(t)];
        if (c0 >= c1) continue;
        const GatedActivationArgs& g = in.gated;
        rows_access(
            Rows{const_cast<float*>(g.gate.data), g.gate.n_rows, g.gate.n_cols, g.gate.stride},
            false, false, t, c0, c1);
        rows_access(Rows{const_cast<float*>(g.up.data), g.up.n_rows, g.up.n_cols, g.up.stride},
                    false, false, t, c0, c1);
        rows_access(g.out, false, true, t, c0, c1);
      }
      return;
    case Instr::Kind::kSerial:
      break;
  }
  // A serial node: everything it names, as written, on thread 0; and the layer's KV pages or
  // recurrent state.
  std::vector<Tensor> ts;
  node_tensors(in.node->args, ts);
  for (const Tensor& t : ts) {
    const RowSpace r = graph_->buffer_decl(t.buf).rows;
    const int64_t n = r == RowSpace::kRows || r == RowSpace::kWanted ? width_ : 0;
    const bool logits = t.buf == io_.logits;
    float* data = logits ? nullptr : base_[static_cast<size_t>(t.buf)];
    rows_access(Rows{data, n, t.n_cols, logits ? t.n_cols : exec_->stride(t.buf)}, logits, true, 0,
                t.col, t.col + t.n_cols);
  }
  int32_t layer = -1;
  bool state = false;
  std::visit(
      [&](const auto& n) {
        using T = std::decay_t<decltype(n)>;
        if constexpr (std::is_same_v<T, node::KvStore> || std::is_same_v<T, node::Attention> ||
                      std::is_same_v<T, node::LatentAttention>) {
          layer = n.layer;
        } else if constexpr (std::is_same_v<T, node::CausalConv> ||
                             std::is_same_v<T, node::DeltaRule>) {
          layer = n.layer;
          state = true;
        }
      },
      in.node->args);
  if (layer >= 0) {
    Access a;
    a.region = state ? state_region(layer) : kv_region(layer);
    a.n_rows = 1;
    a.c1 = 1;
    a.write = true;
    out.push_back(a);
  }
}

bool Program::accepts(const PassInputs& in) const {
  return in.n_rows == width_ && in.n_wanted == width_ &&
         in.seqs.size() == static_cast<size_t>(width_) && in.lora_slots.empty() &&
         in.n_injected == 0 && in.n_pools == 0 && in.n_pool_rows == 0 && in.observer == nullptr &&
         !in.embed_overlays && !in.head_overlays && !in.wanted.empty() && in.wanted.front() == 0;
}

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

void Program::region(int t, const PassInputs& pass) {
  const auto ut = static_cast<size_t>(t);
  for (const Instr& in : code_) {
    if (in.barrier_before && n_threads_ > 1) barrier();
    if (failed_.load(std::memory_order_relaxed)) continue;
    try {
      switch (in.kind) {
        case Instr::Kind::kSerial:
          if (t == 0) exec_->run_node(*backend_, *in.node, pass);
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
          const int64_t n_out = in.w->n_out;
          for (;;) {
            const int64_t o0 = in.next->fetch_add(in.grain, std::memory_order_relaxed);
            if (o0 >= n_out) break;
            in.job.run(o0, std::min(n_out, o0 + in.grain));
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
      }
    } catch (...) {
      errors_[ut] = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
}

void Program::run(const PassInputs& in, float* logits, int64_t logits_stride) {
  METRALE_CHECK(accepts(in), "circuit: a pass of ", in.n_rows, " rows is not the program's ",
                width_, "-row decode step");
  exec_->begin(in);
  for (Instr& i : code_) {
    if (i.kind != Instr::Kind::kLinear || !i.y_logits) continue;
    // The logits rows are the caller's: only their address changes from step to step.
    const Rows y{logits + i.y_col, i.y.n_rows, i.y.n_cols, logits_stride};
    switch (i.job.kind) {
      case cpu::LinearJob::Kind::kBf16Pairs:
        i.job.pairs.y = y;
        break;
      case cpu::LinearJob::Kind::kQuant:
        i.job.quant.y = y;
        break;
      default:
        i.job.task.y = y;
        break;
    }
  }
  for (Instr& i : code_)
    if (i.next) i.next->store(0, std::memory_order_relaxed);  // published by the dispatch
  failed_.store(false, std::memory_order_relaxed);
  backend_->pool().parallel_for(static_cast<size_t>(n_threads_),
                                [&](size_t, size_t, int t) { region(t, in); });
  for (std::exception_ptr& e : errors_) {
    if (e) {
      std::exception_ptr first = e;
      for (std::exception_ptr& f : errors_) f = nullptr;
      std::rethrow_exception(first);
    }
  }
}

std::string Program::describe() const {
  std::string s;
  char line[256];
  for (const Instr& in : code_) {
    const char* kind = in.kind == Instr::Kind::kSerial   ? "serial"
                       : in.kind == Instr::Kind::kPrep   ? "prep  "
                       : in.kind == Instr::Kind::kLinear ? "split "
                       : in.kind == Instr::Kind::kAdd    ? "split "
                                                         : "split ";
    const std::string_view name =
        in.kind == Instr::Kind::kPrep ? std::string_view("linear_input") : node_name(in.node->args);
    std::snprintf(line, sizeof line, "  %s %s %-16.*s %.*s\n", in.barrier_before ? "|" : " ", kind,
                  static_cast<int>(name.size()), name.data(),
                  static_cast<int>(graph_->scope_of(*in.node).size()),
                  graph_->scope_of(*in.node).data());
    s += line;
  }
  return s;
}

}  // namespace metrale
