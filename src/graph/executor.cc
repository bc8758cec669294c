#include "graph/executor.h"

#include <algorithm>

#include "core/error.h"

namespace metrale {
namespace {

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

// Whether the pass meets every condition of `when`.
bool holds(When when, const PassInputs& in) {
  if (has(when, When::kLoraRows) && in.lora_slots.empty()) return false;
  if (has(when, When::kEmbedOverlays) && !in.embed_overlays) return false;
  if (has(when, When::kHeadOverlays) && !in.head_overlays) return false;
  if (has(when, When::kWanted) && in.n_wanted == 0) return false;
  if (has(when, When::kInjected) && in.n_injected == 0) return false;
  if (has(when, When::kPooled) && in.n_pools == 0) return false;
  return true;
}

}  // namespace

Executor::Executor(const Graph& graph, const GraphPlan& plan, void* arena)
    : graph_(&graph), plan_(&plan) {
  const size_t n = graph.buffers().size();
  METRALE_CHECK(plan.offset.size() == n, "executor: the plan covers ", plan.offset.size(),
                " buffers, the graph has ", n);
  METRALE_CHECK(arena != nullptr || plan.arena_bytes == 0, "executor: no arena");
  base_.assign(n, nullptr);
  own_.assign(n, nullptr);
  stride_.assign(plan.stride.begin(), plan.stride.end());
  n_rows_.assign(n, 0);
  for (size_t b = 0; b < n; ++b) {
    if (plan.offset[b] >= 0)
      own_[b] = reinterpret_cast<float*>(static_cast<std::byte*>(arena) + plan.offset[b]);
  }
  size_t most = 0;
  for (const Node& node : graph.nodes()) {
    if (const auto* l = std::get_if<node::Linears>(&node.args))
      most = std::max(most, l->calls.size());
  }
  calls_.resize(most);
}

void Executor::bind(BufferId id, float* data, int64_t stride) {
  const auto b = static_cast<size_t>(id);
  METRALE_CHECK(b < own_.size() && graph_->buffers()[b].kind == BufferKind::kExternal,
                "executor: buffer ", id, " is not an external buffer of the graph");
  METRALE_CHECK(data != nullptr && stride >= graph_->buffers()[b].width, "executor: binding '",
                graph_->buffers()[b].name, "' to rows of stride ", stride, " (width ",
                graph_->buffers()[b].width, ")");
  own_[b] = data;
  stride_[b] = stride;
}

Rows Executor::rows(const Tensor& t) const {
  const auto b = static_cast<size_t>(t.buf);
  return {base_[b] + t.col, n_rows_[b], t.n_cols, stride_[b]};
}

std::span<float> Executor::floats(const Tensor& t) const {
  const auto b = static_cast<size_t>(t.buf);
  return {base_[b], static_cast<size_t>(n_rows_[b] * stride_[b])};
}

std::span<int32_t> Executor::ints(const Tensor& t) const {
  const auto b = static_cast<size_t>(t.buf);
  return {reinterpret_cast<int32_t*>(base_[b]), static_cast<size_t>(n_rows_[b] * stride_[b])};
}

StateSlice Executor::state_slice(const PassInputs& in, int32_t layer, bool conv) const {
  METRALE_CHECK(static_cast<size_t>(layer) < in.state.size() &&
                    in.state[static_cast<size_t>(layer)].has_state,
                "executor: layer ", layer, " keeps a recurrent state the pass does not bind");
  const LayerStateOffsets& o = in.state[static_cast<size_t>(layer)];
  return {.runs = in.state_runs, .offset = conv ? o.conv : o.ssm, .dtype = in.state_dtype};
}

void Executor::run(Backend& be, const PassInputs& in) {
  begin(in);
  for (const Node& node : graph_->nodes()) {
    if (holds(node.when, in)) run_node(be, node, in);
  }
}

void Executor::begin(const PassInputs& in) {
  const std::span<const BufferDecl> decls = graph_->buffers();
  for (size_t b = 0; b < decls.size(); ++b) {
    base_[b] = own_[b];
    switch (decls[b].rows) {
      case RowSpace::kRows:
        n_rows_[b] = in.n_rows;
        break;
      case RowSpace::kWanted:
        n_rows_[b] = in.n_wanted;
        break;
      case RowSpace::kInjected:
        n_rows_[b] = in.n_injected;
        break;
      case RowSpace::kMerged:
        n_rows_[b] = in.n_merged;
        break;
      case RowSpace::kPoolRows:
        n_rows_[b] = in.n_pool_rows;
        break;
      case RowSpace::kPools:
        n_rows_[b] = in.n_pools;
        break;
    }
  }
  METRALE_CHECK(in.n_merged <= in.n_rows, "executor: ", in.n_merged, " merged rows of ", in.n_rows);
  METRALE_CHECK(in.n_rows <= plan_->max_rows && in.n_wanted <= in.n_rows &&
                    in.n_pool_rows <= in.n_rows && in.n_pools <= in.n_pool_rows,
                "executor: a pass of ", in.n_rows, " rows (", in.n_wanted, " wanted, ",
                in.n_pool_rows, " pooled into ", in.n_pools, ") exceeds the plan's ",
                plan_->max_rows, " rows");
}

void Executor::run_node(Backend& be, const Node& node, const PassInputs& in) {
  auto kv = [&](int32_t layer) {
    METRALE_CHECK(static_cast<size_t>(layer) < in.kv.size(), "executor: layer ", layer,
                  " has no KV view in the pass");
    return in.kv[static_cast<size_t>(layer)];
  };
  auto lora_slots_of = [&](const Tensor& x) {
    return graph_->buffer_decl(x.buf).rows == RowSpace::kRows ? in.lora_slots
                                                              : in.wanted_lora_slots;
  };
  std::visit(
      Overloaded{
          [&](const node::Linear& n) { be.linear(rows(n.x), *n.w, rows(n.y)); },
          [&](const node::Linears& n) {
            for (size_t i = 0; i < n.calls.size(); ++i)
              calls_[i] = {rows(n.calls[i].x), n.calls[i].w, rows(n.calls[i].y)};
            be.linears(std::span<const LinearCall>(calls_.data(), n.calls.size()));
          },
          [&](const node::Embedding& n) { be.embedding(*n.table, in.ids, rows(n.out)); },
          [&](const node::RmsNorm& n) {
            RmsNormArgs a{.x = rows(n.x),
                          .out = rows(n.out),
                          .weight = n.weight,
                          .eps = n.eps,
                          .style = n.style,
                          .group = n.group};
            if (n.residual.valid()) a.residual = rows(n.residual);
            if (n.gate.valid()) a.gate = rows(n.gate);
            be.rms_norm(a);
          },
          [&](const node::Rope& n) {
            RopeArgs a{.x = rows(n.x),
                       .n_heads = n.n_heads,
                       .head_dim = n.head_dim,
                       .positions = in.positions,
                       .table = in.rope,
                       .offset = n.offset,
                       .pairs = n.pairs};
            if (n.cos.valid()) {  // the pass's own rows: row r at "position" r
              a.table = {rows(n.cos).data, rows(n.sin).data, 2 * n.cos.n_cols, in.n_rows};
              a.positions = in.row_index;
            }
            be.rope(a);
          },
          [&](const node::RopeRows& n) {
            be.rope_rows({.positions = in.positions3,
                          .inv_freq = n.inv_freq,
                          .axes = n.axes,
                          .half = n.half,
                          .scaling = n.scaling,
                          .cos = rows(n.cos),
                          .sin = rows(n.sin)});
          },
          [&](const node::InjectRows& n) {
            be.scatter_rows(rows(n.x), in.injected_rows, rows(n.out), n.add);
          },
          [&](const node::KvStore& n) {
            be.kv_store({.k = rows(n.k), .v = rows(n.v), .slots = in.slots, .cache = kv(n.layer)});
          },
          [&](const node::Attention& n) {
            be.attention({.q = rows(n.q),
                          .out = rows(n.out),
                          .cache = kv(n.layer),
                          .seqs = in.seqs,
                          .row_seq = in.row_seq,
                          .positions = in.positions,
                          .shape = n.shape,
                          .tree = in.tree});
          },
          [&](const node::LatentAttention& n) {
            be.latent_attention({.q_latent = rows(n.q_latent),
                                 .q = rows(n.q),
                                 .nope_dim = n.nope_dim,
                                 .kv = rows(n.kv),
                                 .slots = in.slots,
                                 .out = rows(n.out),
                                 .cache = kv(n.layer),
                                 .seqs = in.seqs,
                                 .row_seq = in.row_seq,
                                 .positions = in.positions,
                                 .n_heads = n.n_heads,
                                 .kv_rank = n.kv_rank,
                                 .scale = n.scale,
                                 .tree = in.tree});
          },
          [&](const node::GatedActivation& n) {
            be.gated_activation(
                {.gate = rows(n.gate), .up = rows(n.up), .out = rows(n.out), .act = n.act});
          },
          [&](const node::Route& n) {
            be.route({.logits = rows(n.logits),
                      .top_k = n.top_k,
                      .normalize = n.normalize,
                      .experts = ints(n.experts),
                      .weights = floats(n.weights),
                      .scoring = n.scoring,
                      .correction_bias = n.correction_bias,
                      .n_group = n.n_group,
                      .topk_group = n.topk_group,
                      .scale = n.scale});
          },
          [&](const node::Moe& n) {
            be.moe({.x = rows(n.x),
                    .experts = ints(n.experts),
                    .weights = floats(n.weights),
                    .top_k = n.top_k,
                    .expert_weights = n.expert_weights,
                    .act = n.act,
                    .out = rows(n.out),
                    .lora_slots = in.lora_slots,
                    .gate_up_lora = n.gate_up_lora,
                    .down_lora = n.down_lora});
          },
          [&](const node::Add& n) { be.add(rows(n.x), rows(n.y)); },
          [&](const node::CausalConv& n) {
            be.causal_conv({.x = rows(n.x),
                            .out = rows(n.out),
                            .weight = n.weight,
                            .kernel = n.kernel,
                            .silu = n.silu,
                            .row_seq = in.row_seq,
                            .state = state_slice(in, n.layer, true)});
          },
          [&](const node::DeltaRule& n) {
            be.delta_rule({.q = rows(n.q),
                           .k = rows(n.k),
                           .v = rows(n.v),
                           .a = rows(n.a),
                           .b = rows(n.b),
                           .a_log = n.a_log,
                           .dt_bias = n.dt_bias,
                           .n_k_heads = n.n_k_heads,
                           .n_v_heads = n.n_v_heads,
                           .k_head_dim = n.k_head_dim,
                           .v_head_dim = n.v_head_dim,
                           .out = rows(n.out),
                           .row_seq = in.row_seq,
                           .state = state_slice(in, n.layer, false)});
          },
          [&](const node::SigmoidMul& n) {
            be.sigmoid_mul({.gate = rows(n.gate), .y = rows(n.y)});
          },
          [&](const node::Lora& n) {
            be.lora({.x = rows(n.x),
                     .y = rows(n.y),
                     .slots = lora_slots_of(n.x),
                     .weights = n.weights});
          },
          [&](const node::GatherWanted& n) {
            const auto x = static_cast<size_t>(n.x.buf), out = static_cast<size_t>(n.out.buf);
            const std::span<const int32_t> which =
                graph_->buffer_decl(n.out.buf).rows == RowSpace::kPoolRows ? in.pool_rows
                                                                           : in.wanted;
            const auto k = static_cast<int64_t>(which.size());
            const bool range = k > 0 && which.back() == which.front() + k - 1;
            if (range && n.x.col == 0 && n.out.col == 0 && stride_[x] == stride_[out]) {
              base_[out] = base_[x] + which.front() * stride_[x];  // a view: no copy
            } else {
              base_[out] = own_[out];
              be.gather_rows(rows(n.x), which, rows(n.out));
            }
          },
          [&](const node::TokenOverlay& n) {
            be.token_overlay(
                {.ids = in.ids, .slots = in.lora_slots, .overlays = n.overlays, .h = rows(n.h)});
          },
          [&](const node::HeadOverlay& n) {
            be.head_overlay({.x = rows(n.x),
                             .slots = in.wanted_lora_slots,
                             .overlays = n.overlays,
                             .logits = rows(n.logits)});
          },
          [&](const node::LayerNorm& n) {
            be.layer_norm({.x = rows(n.x),
                           .out = rows(n.out),
                           .weight = n.weight,
                           .bias = n.bias,
                           .eps = n.eps});
          },
          [&](const node::Activate& n) {
            be.activation({.x = rows(n.x), .out = rows(n.out), .act = n.act});
          },
          [&](const node::VarlenAttention& n) {
            be.varlen_attention({.q = rows(n.q),
                                 .k = rows(n.k),
                                 .v = rows(n.v),
                                 .out = rows(n.out),
                                 .cu_seqlens = n.windows ? in.cu_window_seqlens : in.cu_seqlens,
                                 .n_heads = n.n_heads,
                                 .head_dim = n.head_dim,
                                 .scale = n.scale});
          },
          [&](const node::MergeRows& n) { be.merge_rows(rows(n.x), rows(n.out)); },
          [&](const node::GatherRows& n) {
            be.gather_rows(
                rows(n.x),
                n.list == node::RowList::kWindowRows ? in.window_rows : in.merged_inverse,
                rows(n.out));
          },
          [&](const node::SegmentSum& n) {
            be.segment_sum(rows(n.x), in.pool_offsets, rows(n.out));
          },
          [&](const node::TapSum& n) {
            be.tap_sum({.table = n.table,
                        .table_rows = n.table_rows,
                        .taps = in.pos_taps,
                        .weights = in.pos_weights,
                        .n_taps = n.n_taps,
                        .out = rows(n.out)});
          },
          [&](const node::Observe& n) {
            METRALE_CHECK(in.observer != nullptr, "executor: an Observe node without an observer");
            (*in.observer)(n.index, rows(n.x));
          },
      },
      node.args);
}

}  // namespace metrale
