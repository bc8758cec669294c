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

ExecutorKind parse_executor(std::string_view text, std::string_view flag) {
  if (text == "layers") return ExecutorKind::kLayers;
  if (text == "circuit") return ExecutorKind::kCircuit;
  throw Error(std::string(flag) + ": expected layers or circuit, found '" + std::string(text) +
              "'");
}

std::string_view executor_name(ExecutorKind kind) {
  return kind == ExecutorKind::kCircuit ? "circuit" : "layers";
}

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
    if (in.kind == Instr::Kind::kSerial && n_threads_ > 1 && splits_itself(node))
      in.kind = Instr::Kind::kPooled;
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
    if (n_threads_ == 1) break;  // no barriers to save
    if (in.kind != Instr::Kind::kNorm || in.norm_groups) continue;
    in.kind = Instr::Kind::kSerial;
    const int64_t n = place_barriers(false);
    if (n < fewest) {
      fewest = n;
    } else {
      in.kind = Instr::Kind::kNorm;
    }
  }
  for (size_t k = 0; k < code_.size(); ++k) {
    Instr& in = code_[k];
    if (in.kind == Instr::Kind::kAttention) in.plan.spans = in.spans.data();
    if (in.kind == Instr::Kind::kPooled) {
      ++stats_.pooled;
      pooled_.push_back(k);
    } else if (in.kind == Instr::Kind::kSerial || in.kind == Instr::Kind::kPrep) {
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
  if (n_threads_ > 1) {
    // Each region's end (the pool's join; a region between two adjacent pooled ops is empty
    // and never started), and each pooled op's own join.
    int64_t joins = static_cast<int64_t>(pooled_.size());
    size_t begin = 0;
    for (size_t k = 0; k <= pooled_.size(); ++k) {
      const size_t end = k < pooled_.size() ? pooled_[k] : code_.size();
      if (end > begin) ++joins;
      begin = end + 1;
    }
    stats_.barriers += joins;
    stats_.barriers_unsplit += joins;
  }
  stats_.width = width;
  stats_.instructions = static_cast<int64_t>(code_.size());
  stats_.workspace_bytes = plan.arena_bytes + scratch_bytes;
  errors_.resize(static_cast<size_t>(n_threads_));
}

bool Program::accepts(const PassInputs& in) const {
  return in.n_rows == width_ && in.n_wanted == width_ &&
         in.seqs.size() == static_cast<size_t>(width_) && in.lora_slots.empty() &&
         in.n_injected == 0 && in.n_pools == 0 && in.n_pool_rows == 0 && in.observer == nullptr &&
         !in.embed_overlays && !in.head_overlays && in.tree.empty() && !in.wanted.empty() &&
         in.wanted.front() == 0;
}

std::string Program::describe() const {
  std::string s;
  char line[256];
  for (const Instr& in : code_) {
    const char* kind = in.kind == Instr::Kind::kSerial   ? "serial"
                       : in.kind == Instr::Kind::kPooled ? "pooled"
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
