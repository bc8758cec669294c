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

// Whether a norm's groups (per-head qk-norm) split: each group is normalised alone, so a thread
// may take whole groups of every row.
bool norm_by_groups(const node::RmsNorm& n) {
  return n.group > 0 && n.group < n.x.n_cols && n.x.n_cols % n.group == 0 && !n.residual.valid();
}

// Whether a norm splits at all: by groups, or by rows when the step has more than one (a row's
// sum of squares is one thread's, in the kernel's order).
bool norm_splits(const node::RmsNorm& n, int64_t width) { return norm_by_groups(n) || width > 1; }

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

Program::~Program() = default;

Program::Program(const Graph& graph, const GraphPlan& plan, Executor& exec, CpuBackend& backend,
                 int64_t width, ProgramIo io, FusionPolicy fusion)
    : graph_(&graph),
      exec_(&exec),
      backend_(&backend),
      width_(width),
      n_threads_(backend.pool().size()),
      io_(io),
      fusion_(fusion) {
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

  // A static split of n_groups groups of `per` consecutive items over the threads (the backend's
  // parallel_for split when per is 1).
  auto item_partition = [&](int64_t n_groups, int64_t per) {
    std::vector<std::pair<int64_t, int64_t>> part(static_cast<size_t>(n_threads_));
    for (int t = 0; t < n_threads_; ++t) {
      size_t gb, ge;
      ThreadPool::chunk_range(static_cast<size_t>(n_groups), n_threads_, t, &gb, &ge);
      part[static_cast<size_t>(t)] = {static_cast<int64_t>(gb) * per,
                                      static_cast<int64_t>(ge) * per};
    }
    return part;
  };
  // The kv heads of each layer's cache, as its attention names them (0: no attention).
  std::vector<int64_t> kv_heads;
  for (const Node& node : graph.nodes()) {
    if (const auto* a = std::get_if<node::Attention>(&node.args)) {
      if (kv_heads.size() <= static_cast<size_t>(a->layer))
        kv_heads.resize(static_cast<size_t>(a->layer) + 1, 0);
      kv_heads[static_cast<size_t>(a->layer)] = a->shape.n_kv_heads;
    }
  }
  auto kv_heads_of = [&](int32_t layer) {
    return static_cast<size_t>(layer) < kv_heads.size() ? kv_heads[static_cast<size_t>(layer)] : 0;
  };

  // The nodes a decode step runs (it asks for logits and nothing else a condition names).
  std::vector<const Node*> run;
  for (const Node& node : graph.nodes()) {
    if ((static_cast<uint8_t>(node.when) & ~static_cast<uint8_t>(When::kWanted)) == 0)
      run.push_back(&node);
  }
  // The executor makes the wanted rows a view of x when they are one range from row 0, which
  // every accepted step's are (all its rows want logits).
  auto is_view = [&](const Node& node) {
    const auto* gw = std::get_if<node::GatherWanted>(&node.args);
    return gw != nullptr && gw->x.col == 0 && gw->out.col == 0 &&
           exec.stride(gw->x.buf) == exec.stride(gw->out.buf) &&
           graph.buffer_decl(gw->out.buf).rows == RowSpace::kWanted;
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.buf == b.buf && a.col == b.col && a.n_cols == b.n_cols;
  };
  // Candidates the policy allowed that run unfused: one line per reason, with where first.
  std::vector<std::pair<std::string, std::pair<std::string, int64_t>>> unfused;
  auto not_fused = [&](const Node& node, std::string why) {
    ++stats_.not_fused;
    for (auto& [w, at] : unfused) {
      if (w == why) {
        ++at.second;
        return;
      }
    }
    unfused.push_back({std::move(why), {std::string(graph.scope_of(node)), 1}});
  };
  for (const Node* node : run) {  // views first: a fusion compares the addresses they give
    if (is_view(*node)) {
      const auto& gw = std::get<node::GatherWanted>(node->args);
      base[static_cast<size_t>(gw.out.buf)] = base[static_cast<size_t>(gw.x.buf)];
    }
  }
  std::vector<bool> residual_taken(run.size(), false), dropped(run.size(), false);
  std::vector<node::RmsNorm> pending_norm(run.size());  // a norm the linear i runs first
  std::vector<bool> has_pending(run.size(), false);

  size_t scratch_bytes = 0;
  size_t private_floats = 0;  // per thread
  for (size_t i = 0; i < run.size(); ++i) {
    const Node& node = *run[i];
    ++stats_.layer_dispatches;
    if (dropped[i]) continue;  // folded into the instruction before it
    const Node* next = i + 1 < run.size() ? run[i + 1] : nullptr;
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
      const auto prep_need = static_cast<size_t>(
          bf16 ? in.x.n_rows * in.x.n_cols * static_cast<int64_t>(sizeof(uint16_t)) : bytes);
      if (has_pending[i]) {
        // The norm before it, on every thread into the thread's own rows (norm fusion).
        const node::RmsNorm& nm = pending_norm[i];
        in.pre_norm = true;
        in.norm = {.x = rows_of(nm.x),
                   .out = rows_of(nm.out),
                   .weight = nm.weight,
                   .eps = nm.eps,
                   .style = nm.style,
                   .group = nm.group};
        in.part = item_partition(nm.x.n_cols, 1);  // the columns of out each thread writes
        in.private_stride = (nm.x.n_cols + 15) / 16 * 16;
        in.private_input = static_cast<size_t>(width * in.private_stride);
        private_floats = std::max(private_floats, in.private_input + (prep_need + 63) / 64 * 16);
        in.label = "rms_norm+linear";
      } else if (bf16 || bytes != 0) {
        Instr prep;
        prep.node = &node;
        prep.w = in.w;
        prep.x = in.x;
        prep.kind = Instr::Kind::kPrep;
        prep.prep_bf16 = bf16;
        prep.scratch_offset = scratch_bytes;
        in.scratch_offset = scratch_bytes;
        scratch_bytes += (prep_need + 63) / 64 * 64;
        code_.push_back(std::move(prep));
      }
      // The kernel's piece size (the pairs kernel takes whole tile groups).
      const int64_t multiple = bf16 ? cpu::kPairsTileGroups : 1;
      int64_t n_claimed = n->w->n_out;
      // Epilogues: the residual add of the node after it, or its gated activation.
      // (Past views of y: the final norm reads the wanted rows, a view of every row.)
      size_t k = i + 1;
      while (k < run.size() && is_view(*run[k])) ++k;
      auto reads_y = [&](const Tensor& t) {
        const Rows r = rows_of(t);
        return t.buf != io.logits && r.data == in.y.data && r.stride == in.y.stride &&
               r.n_cols == in.y.n_cols && r.n_rows == in.y.n_rows;
      };
      if (fusion.residual && !in.y_logits && k < run.size()) {
        if (const auto* nm = std::get_if<node::RmsNorm>(&run[k]->args);
            nm != nullptr && nm->residual.valid() && reads_y(nm->x) && !nm->gate.valid()) {
          in.add_to = rows_of(nm->residual);
          residual_taken[k] = true;
        } else if (const auto* a = std::get_if<node::Add>(&run[k]->args);
                   a != nullptr && reads_y(a->x) && a->y.buf != io.logits) {
          in.add_to = rows_of(a->y);
          dropped[k] = true;
        }
        if (in.add_to.data != nullptr) {
          ++stats_.fused_residual;
          in.label = (in.label.empty() ? "linear" : in.label) + "+add";
        }
      }
      if (fusion.gate_up && next != nullptr && in.add_to.data == nullptr) {
        if (const auto* g = std::get_if<node::GatedActivation>(&next->args)) {
          const int64_t I = g->gate.n_cols;
          const int64_t step = cpu::kLinearUnit * multiple;
          if (n->y.n_cols != 2 * I || !same(g->gate, n->y.cols(0, I)) ||
              !same(g->up, n->y.cols(I, I)) || in.y_logits) {
            not_fused(*next, "gate_up: the gate and up products are not one linear's outputs");
          } else if (!same(g->out, g->gate) && g->out.buf == n->y.buf) {
            not_fused(*next, "gate_up: the product is written beside its operands");
          } else if (I % step != 0) {
            not_fused(*next, "gate_up: the intermediate size " + std::to_string(I) +
                                 " is not a multiple of the kernel's " + std::to_string(step) +
                                 " outputs");
          } else {
            in.gate_up = true;
            in.half = I;
            in.gated = {.gate = rows_of(g->gate),
                        .up = rows_of(g->up),
                        .out = rows_of(g->out),
                        .act = g->act};
            n_claimed = I;
            dropped[i + 1] = true;
            ++stats_.fused_gate_up;
            in.label = (in.label.empty() ? "linear" : in.label) + "+gated_act";
          }
        }
      }
      const int64_t units = (n_claimed + cpu::kLinearUnit - 1) / cpu::kLinearUnit;
      int64_t grain = std::max<int64_t>(1, units / (n_threads_ * 8));
      grain = (grain + multiple - 1) / multiple * multiple;
      in.grain = grain * cpu::kLinearUnit;
      in.n_claimed = n_claimed;
      in.next = std::make_unique<std::atomic<int64_t>>(0);
    } else if (const auto* a = std::get_if<node::Add>(&node.args);
               a != nullptr && a->y.buf != io.logits) {
      if (fusion.residual) not_fused(node, "residual: the operand is not the linear's before it");
      in.kind = Instr::Kind::kAdd;
      in.x = rows_of(a->x);
      in.y = rows_of(a->y);
      in.part = partition(a->x.n_cols, 1);
    } else if (const auto* g = std::get_if<node::GatedActivation>(&node.args);
               g != nullptr && g->out.buf != io.logits) {
      if (fusion.gate_up && (i == 0 || !std::holds_alternative<node::Linear>(run[i - 1]->args)))
        not_fused(node, "gate_up: no linear right before it");
      in.kind = Instr::Kind::kGated;
      in.gated = {
          .gate = rows_of(g->gate), .up = rows_of(g->up), .out = rows_of(g->out), .act = g->act};
      in.part = partition(g->gate.n_cols, 1);
    } else if (const auto* r = std::get_if<node::Rope>(&node.args);
               r != nullptr && !r->cos.valid()) {
      // Heads rotate independently: each thread whole heads of every row.
      in.kind = Instr::Kind::kRope;
      in.rope = {.x = rows_of(r->x),
                 .n_heads = r->n_heads,
                 .head_dim = r->head_dim,
                 .offset = r->offset,
                 .pairs = r->pairs};
      in.part = item_partition(r->n_heads, 1);
    } else if (const auto* nm0 = std::get_if<node::RmsNorm>(&node.args)) {
      // With its residual add taken by the linear before it, the norm reads the residual.
      node::RmsNorm nm = *nm0;
      if (residual_taken[i]) {
        nm.x = nm.residual;
        nm.residual = Tensor{};
        in.own = std::make_unique<Node>(node);
        in.own->args = nm;
        in.node = in.own.get();
      } else if (fusion.residual && nm.residual.valid()) {
        not_fused(node, "residual: the operand is not the linear's before it");
      }
      const bool whole_rows = nm.group == 0 || nm.group == nm.x.n_cols;
      if (fusion.norm && whole_rows && !nm.gate.valid()) {
        size_t j = i + 1;
        while (j < run.size() && is_view(*run[j])) ++j;
        const node::Linear* l = j < run.size() ? std::get_if<node::Linear>(&run[j]->args) : nullptr;
        const Rows out = rows_of(nm.out);
        if (nm.residual.valid()) {
          not_fused(node, "norm: it adds a residual no linear took");
        } else if (nm.out.buf == nm.x.buf) {
          not_fused(node, "norm: it normalises in place");
        } else if (l == nullptr || rows_of(l->x).data != out.data ||
                   exec.stride(l->x.buf) != out.stride || l->x.n_cols != out.n_cols ||
                   has_pending[j]) {
          not_fused(node, "norm: the next op is not a linear reading its output");
        } else {
          pending_norm[j] = nm;
          has_pending[j] = true;
          ++stats_.fused_norm;
          continue;  // the linear runs it
        }
      }
      if (norm_splits(nm, width)) {
        in.kind = Instr::Kind::kNorm;
        in.norm = {.x = rows_of(nm.x),
                   .out = rows_of(nm.out),
                   .weight = nm.weight,
                   .eps = nm.eps,
                   .style = nm.style,
                   .group = nm.group};
        if (nm.residual.valid()) in.norm.residual = rows_of(nm.residual);
        if (nm.gate.valid()) in.norm.gate = rows_of(nm.gate);
        in.norm_groups = norm_by_groups(nm);
        in.part =
            in.norm_groups ? item_partition(nm.x.n_cols / nm.group, 1) : item_partition(width, 1);
      }
    } else if (const auto* kv = std::get_if<node::KvStore>(&node.args);
               kv != nullptr && kv_heads_of(kv->layer) > 0) {
      in.kind = Instr::Kind::kKvStore;
      in.kv = {.k = rows_of(kv->k), .v = rows_of(kv->v)};
      in.layer = kv->layer;
      in.kv_heads = kv_heads_of(kv->layer);
      in.part = item_partition(in.kv_heads, width);  // head-major items: whole heads per thread
    } else if (const auto* at = std::get_if<node::Attention>(&node.args);
               at != nullptr && at->shape.head_dim <= cpu::kMaxHeadDim &&
               at->shape.n_kv_heads > 0 && at->shape.n_heads % at->shape.n_kv_heads == 0) {
      in.kind = Instr::Kind::kAttention;
      in.attn = {.q = rows_of(at->q), .out = rows_of(at->out), .shape = at->shape};
      in.layer = at->layer;
      // A decode step's rows are one sequence each, so the plan's spans (one row each) are the
      // same every step: planned here as the backend plans each call.
      in.plan = cpu::plan_attention(at->shape);
      std::vector<int32_t> row_seq(static_cast<size_t>(width));
      for (size_t k = 0; k < row_seq.size(); ++k) row_seq[k] = static_cast<int32_t>(k);
      cpu::AttentionTask task = cpu::attention_task(in.attn);
      task.row_seq = row_seq.data();
      in.spans.resize(static_cast<size_t>(width));
      in.plan.n_spans = cpu::attention_row_spans(task, in.plan.rows_per_tile, in.spans.data());
      in.plan.spans = in.spans.data();
      in.part = item_partition(in.plan.n_items(), 1);
    } else if (is_view(node)) {
      in.view = true;
      --stats_.layer_dispatches;  // the layer loop dispatches nothing for a view either
    }
    code_.push_back(std::move(in));
  }
  for (const auto& [why, at] : unfused) {
    notes_.push_back(why + " (at " + at.first +
                     (at.second > 1 ? " and " + std::to_string(at.second - 1) + " more" : "") +
                     ")");
  }
  scratch_.resize((scratch_bytes + sizeof(float) - 1) / sizeof(float) + 16);
  auto* scratch =
      reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(scratch_.data()) + 63) / 64 * 64);
  scratch_base_ = reinterpret_cast<uintptr_t>(scratch);
  private_stride_ = (private_floats + 15) / 16 * 16;
  private_.resize(private_stride_ * static_cast<size_t>(n_threads_) + 16);
  float* priv =
      reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(private_.data()) + 63) / 64 * 64);
  private_base_ = priv;
  for (Instr& in : code_) {
    if (in.kind != Instr::Kind::kLinear) continue;
    const bool bf16 = cpu::reads_bf16_input(*in.w);
    const bool quant = cpu::quant_input_bytes(*in.w) != 0;
    if (!in.pre_norm) {
      in.jobs.push_back(cpu::make_linear_job(
          in.x, bf16 ? reinterpret_cast<const uint16_t*>(scratch + in.scratch_offset) : nullptr,
          *in.w, in.y, quant ? scratch + in.scratch_offset : nullptr));
      continue;
    }
    // Thread t's job reads thread t's own normalised rows (and their kernel input after them).
    for (int t = 0; t < n_threads_; ++t) {
      float* own = priv + static_cast<size_t>(t) * private_stride_;
      const ConstRows x{own, in.x.n_rows, in.x.n_cols, in.private_stride};
      float* input = own + in.private_input;
      in.jobs.push_back(
          cpu::make_linear_job(x, bf16 ? reinterpret_cast<const uint16_t*>(input) : nullptr, *in.w,
                               in.y, quant ? input : nullptr));
    }
  }
  for (Instr& in : code_) {
    if (in.kind == Instr::Kind::kPrep)
      in.y = Rows{reinterpret_cast<float*>(scratch + in.scratch_offset), 0, 0, 0};
  }

  // A whole-row norm split by rows saves little at decode widths; where the split costs a
  // barrier (beside serial ops: the embedding, MoE), it runs on thread 0 instead.
  int64_t fewest = place_barriers(false);
  for (Instr& in : code_) {
    if (in.kind != Instr::Kind::kNorm || in.norm_groups) continue;
    in.kind = Instr::Kind::kSerial;
    const int64_t n = place_barriers(false);
    if (n < fewest) {
      fewest = n;
    } else {
      in.kind = Instr::Kind::kNorm;
    }
  }
  for (Instr& in : code_) {
    if (in.kind == Instr::Kind::kAttention) in.plan.spans = in.spans.data();
    if (in.kind == Instr::Kind::kSerial || in.kind == Instr::Kind::kPrep) {
      ++stats_.serial;
    } else {
      ++stats_.partitioned;
    }
    if (in.kind == Instr::Kind::kRope || in.kind == Instr::Kind::kNorm ||
        in.kind == Instr::Kind::kKvStore || in.kind == Instr::Kind::kAttention)
      ++stats_.split_ops;
  }
  stats_.barriers = place_barriers(false);
  stats_.barriers_unsplit = place_barriers(true);
  if (n_threads_ > 1) {  // the region's end (the pool's join)
    ++stats_.barriers;
    ++stats_.barriers_unsplit;
  }
  stats_.width = width;
  stats_.instructions = static_cast<int64_t>(code_.size());
  stats_.workspace_bytes = plan.arena_bytes + scratch_bytes;
  errors_.resize(static_cast<size_t>(n_threads_));
}

int64_t Program::place_barriers(bool unsplit) {
  // Before an instruction one of whose threads touches what another thread touched since the
  // last barrier (one of them writing).
  int64_t n = 0;
  std::vector<Access> since, mine;
  for (Instr& in : code_) {
    if (!unsplit) in.barrier_before = false;
    mine.clear();
    add_accesses(in, mine, unsplit);
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
      if (!unsplit) in.barrier_before = true;
      ++n;
      since.clear();
    }
    since.insert(since.end(), mine.begin(), mine.end());
  }
  return n;
}

void Program::add_accesses(const Instr& in, std::vector<Access>& out, bool unsplit) const {
  if (in.view) return;
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
  // Kv heads [h0, h1) of a layer's KV pages.
  auto kv_access = [&](int32_t layer, int64_t h0, int64_t h1, bool write, int t) {
    Access a;
    a.region = kv_region(layer);
    a.n_rows = 1;
    a.c0 = h0;
    a.c1 = h1;
    a.write = write;
    a.thread = t;
    out.push_back(a);
  };
  auto sub_rows = [](const Rows& r, int64_t r0, int64_t r1) {
    return Rows{r.data + r0 * r.stride, r1 - r0, r.n_cols, r.stride};
  };
  auto c = [](const ConstRows& r) {
    return Rows{const_cast<float*>(r.data), r.n_rows, r.n_cols, r.stride};
  };
  const bool split_op = in.kind == Instr::Kind::kRope || in.kind == Instr::Kind::kNorm ||
                        in.kind == Instr::Kind::kKvStore || in.kind == Instr::Kind::kAttention;
  switch (unsplit && split_op ? Instr::Kind::kSerial : in.kind) {
    case Instr::Kind::kRope:
      for (int t = 0; t < n_threads_; ++t) {
        const auto [h0, h1] = in.part[static_cast<size_t>(t)];
        if (h0 < h1)
          rows_access(in.rope.x, false, true, t, h0 * in.rope.head_dim, h1 * in.rope.head_dim);
      }
      return;
    case Instr::Kind::kNorm:
      for (int t = 0; t < n_threads_; ++t) {
        const auto [i0, i1] = in.part[static_cast<size_t>(t)];
        if (i0 >= i1) continue;
        const RmsNormArgs& a = in.norm;
        if (in.norm_groups) {
          const int64_t c0 = i0 * a.group, c1 = i1 * a.group;
          rows_access(c(a.x), false, false, t, c0, c1);
          if (a.gate.data != nullptr) rows_access(c(a.gate), false, false, t, c0, c1);
          rows_access(a.out, false, true, t, c0, c1);
        } else {
          rows_access(sub_rows(c(a.x), i0, i1), false, false, t, 0, a.x.n_cols);
          if (a.residual.data != nullptr)
            rows_access(sub_rows(a.residual, i0, i1), false, true, t, 0, a.x.n_cols);
          if (a.gate.data != nullptr)
            rows_access(sub_rows(c(a.gate), i0, i1), false, false, t, 0, a.x.n_cols);
          rows_access(sub_rows(a.out, i0, i1), false, true, t, 0, a.x.n_cols);
        }
      }
      return;
    case Instr::Kind::kKvStore:
      for (int t = 0; t < n_threads_; ++t) {
        const auto [i0, i1] = in.part[static_cast<size_t>(t)];
        if (i0 >= i1) continue;
        const int64_t h0 = i0 / width_, h1 = i1 / width_, hd = in.kv.k.n_cols / in.kv_heads;
        rows_access(c(in.kv.k), false, false, t, h0 * hd, h1 * hd);
        rows_access(c(in.kv.v), false, false, t, h0 * hd, h1 * hd);
        kv_access(in.layer, h0, h1, true, t);
      }
      return;
    case Instr::Kind::kAttention:
      for (int t = 0; t < n_threads_; ++t) {
        const auto [i0, i1] = in.part[static_cast<size_t>(t)];
        cpu::AttentionPlan plan = in.plan;
        plan.spans = in.spans.data();
        const int64_t hd = in.attn.shape.head_dim;
        for (int64_t item = i0; item < i1; ++item) {
          const cpu::AttentionPlan::Tile tl = plan.tile(item);
          const int64_t c0 = (tl.kv_head * plan.group + tl.head_begin) * hd;
          const int64_t c1 = (tl.kv_head * plan.group + tl.head_end) * hd;
          rows_access(sub_rows(c(in.attn.q), tl.row_begin, tl.row_end), false, false, t, c0, c1);
          rows_access(sub_rows(in.attn.out, tl.row_begin, tl.row_end), false, true, t, c0, c1);
          kv_access(in.layer, tl.kv_head, tl.kv_head + 1, false, t);
        }
      }
      return;
    case Instr::Kind::kLinear:
      for (int t = 0; t < n_threads_; ++t) {
        // Claimed dynamically: any thread may write any output.
        if (in.pre_norm) {
          const auto [c0, c1] = in.part[static_cast<size_t>(t)];
          rows_access(c(in.norm.x), false, false, t, 0, in.norm.x.n_cols);
          if (c0 < c1) rows_access(in.norm.out, false, true, t, c0, c1);
        } else if (cpu::reads_bf16_input(*in.w) || cpu::quant_input_bytes(*in.w) != 0) {
          scratch_access(in.scratch_offset, false, t);
        } else {
          rows_access(c(in.x), false, false, t, 0, in.x.n_cols);
        }
        // Rows resolved relative to the tensor's first column: columns [0, n_out) of y.
        rows_access(in.y, in.y_logits, true, t, 0, in.w->n_out, in.y_col);
        if (in.add_to.data != nullptr) rows_access(in.add_to, false, true, t, 0, in.w->n_out);
        if (in.gate_up) rows_access(in.gated.out, false, true, t, 0, in.half);
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
  if (layer >= 0) {  // all of it (every kv head)
    Access a;
    a.region = state ? state_region(layer) : kv_region(layer);
    a.n_rows = 1;
    a.c1 = std::numeric_limits<int32_t>::max();
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
    const std::string_view name = in.kind == Instr::Kind::kPrep ? std::string_view("linear_input")
                                  : !in.label.empty()           ? std::string_view(in.label)
                                                                : node_name(in.node->args);
    std::snprintf(line, sizeof line, "  %s %s %-30.*s %.*s\n", in.barrier_before ? "|" : " ", kind,
                  static_cast<int>(name.size()), name.data(),
                  static_cast<int>(graph_->scope_of(*in.node).size()),
                  graph_->scope_of(*in.node).data());
    s += line;
  }
  return s;
}

}  // namespace metrale
