// Where a program's barriers go (program.h): the bytes each instruction's threads touch, and a
// barrier only before an instruction that touches what another thread touched since the last.
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

int64_t Program::place_barriers(bool unsplit) {
  // Before an instruction one of whose threads touches what another thread touched since the
  // last barrier (one of them writing). One thread never needs one (and without barriers the
  // accesses since the last would be the whole program's: quadratic at wide programs).
  if (n_threads_ == 1) {
    if (!unsplit)
      for (Instr& in : code_) in.barrier_before = false;
    return 0;
  }
  int64_t n = 0;
  std::vector<Access> since, mine;
  for (Instr& in : code_) {
    if (!unsplit) in.barrier_before = false;
    if (in.kind == Instr::Kind::kPooled) {
      // The region ends before it and a new one starts after it: every thread's work so far is
      // done (the pool's joins), so nothing after it waits on anything before.
      since.clear();
      continue;
    }
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
    case Instr::Kind::kPooled:
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

}  // namespace metrale
