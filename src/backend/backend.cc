// The public ops of Backend: validate once, then hand over to the device (do_*). Every check
// that does not depend on the device lives here, so a second backend cannot forget one. The
// messages are assembled only on failure: these checks run on every op of a decode step,
// which must not allocate. The ops that move rows and memory and the vision tower's ops are in
// backend_data_ops.cc, sharing backend_checks.h.
#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>

#include "backend/backend_checks.h"
#include "core/error.h"

namespace metrale {

using backend_checks::check_rows;
using backend_checks::check_span;
using backend_checks::Operand;

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kLinear:
      return "linear";
    case Op::kEmbedding:
      return "embedding";
    case Op::kRmsNorm:
      return "rms_norm";
    case Op::kRope:
      return "rope";
    case Op::kKvStore:
      return "kv_store";
    case Op::kAttention:
      return "attention";
    case Op::kGatedActivation:
      return "gated_activation";
    case Op::kRoute:
      return "route";
    case Op::kMoe:
      return "moe";
    case Op::kAdd:
      return "add";
    case Op::kCausalConv:
      return "causal_conv";
    case Op::kDeltaRule:
      return "delta_rule";
    case Op::kSigmoidMul:
      return "sigmoid_mul";
    case Op::kLatentAttention:
      return "latent_attention";
    case Op::kLora:
      return "lora";
    case Op::kGatherRows:
      return "gather_rows";
    case Op::kTokenOverlay:
      return "token_overlay";
    case Op::kHeadOverlay:
      return "head_overlay";
    case Op::kMemory:
      return "memory";
    case Op::kRopeRows:
      return "rope_rows";
    case Op::kScatterRows:
      return "scatter_rows";
    case Op::kLayerNorm:
      return "layer_norm";
    case Op::kActivation:
      return "activation";
    case Op::kVarlenAttention:
      return "varlen_attention";
    case Op::kMergeRows:
      return "merge_rows";
    case Op::kSegmentSum:
      return "segment_sum";
    case Op::kTapSum:
      return "tap_sum";
  }
  return "unknown-op";
}

std::string_view activation_name(Activation act) {
  switch (act) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGeluTanh:
      return "gelu_pytorch_tanh";
    case Activation::kGelu:
      return "gelu";
    case Activation::kQuickGelu:
      return "quick_gelu";
  }
  return "?";
}

void Backend::require(Op op, WeightFormat format, DType dtype, std::string_view needed_by) const {
  METRALE_CHECK(supports(op, format, dtype), "backend ", name(), ": op ", op_name(op),
                " does not support weight format ", weight_format_name(format), " with dtype ",
                dtype_name(dtype), " (needed by '", needed_by, "')");
}

namespace {

void check_attention_shape(const AttentionShape& s, const KvLayout& kv, int64_t max_head_dim) {
  METRALE_CHECK(s.n_heads > 0 && s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
                "attention: n_heads ", s.n_heads, " must be a positive multiple of n_kv_heads ",
                s.n_kv_heads);
  METRALE_CHECK(s.head_dim > 0 && s.head_dim <= max_head_dim, "attention: head_dim ", s.head_dim,
                " must be in [1, ", max_head_dim, "] on this backend");
  METRALE_CHECK(kv.n_kv_heads == s.n_kv_heads && kv.head_dim == s.head_dim,
                "attention: KV cache holds ", kv.n_kv_heads, " heads of ", kv.head_dim,
                ", but the layer has ", s.n_kv_heads, " of ", s.head_dim);
  METRALE_CHECK(s.sliding_window >= 0, "attention: negative sliding_window ", s.sliding_window);
  METRALE_CHECK(std::isfinite(s.scale) && s.scale >= 0.0f, "attention: bad scale ", s.scale);
}

void check_kv_dtype(const char* op, const KvLayout& kv) {
  METRALE_CHECK(kv_dtype_supported(kv.dtype), op, ": KV cache element type ", dtype_name(kv.dtype),
                " is not one of f32, f16, bf16");
}

void check_table(const KvPageTable& t, const KvLayout& kv, size_t index) {
  METRALE_CHECK(t.seq_len >= 1, "attention: sequence ", index, " has length ", t.seq_len);
  const int64_t pages = (t.seq_len + kv.page_size - 1) / kv.page_size;
  METRALE_CHECK(static_cast<int64_t>(t.block_table.size()) >= pages, "attention: sequence ", index,
                " of length ", t.seq_len, " needs ", pages, " pages, its block table has ",
                t.block_table.size());
  for (int64_t i = 0; i < pages; ++i) {
    const int32_t p = t.block_table[static_cast<size_t>(i)];
    METRALE_CHECK(p >= 0 && p < kv.n_pages, "attention: sequence ", index, " block ", i,
                  " names page ", p, ", outside the cache's [0, ", kv.n_pages, ")");
  }
}

// Tree verification's key remap (backend.h KeyRemap): one entry per row, each root at or below
// the row's position, and the row's remapped indices inside its sequence, past the root.
void check_tree(const char* op, const KeyRemap& tree, std::span<const int32_t> positions,
                std::span<const int32_t> row_seq, std::span<const KvPageTable> seqs) {
  if (tree.empty()) return;
  METRALE_CHECK(tree.rows.size() == positions.size(), op, ": tree: ", tree.rows.size(),
                " rows for ", positions.size());
  for (size_t r = 0; r < positions.size(); ++r) {
    const TreeKeys& t = tree.rows[r];
    const int32_t p = positions[r];
    METRALE_CHECK(t.root >= 0 && t.root <= p, op, ": tree: row ", r, " at position ", p,
                  " has root ", t.root, "; expected 0..", p);
    if (t.root == p) continue;
    const auto n = static_cast<size_t>(p - t.root);
    METRALE_CHECK(t.begin >= 0 && static_cast<size_t>(t.begin) + n <= tree.keys.size(), op,
                  ": tree: row ", r, " reads keys [", t.begin, ", ", t.begin + n, ") of ",
                  tree.keys.size());
    const int64_t len = seqs[static_cast<size_t>(row_seq[r])].seq_len;
    for (size_t j = 0; j < n; ++j) {
      const int32_t k = tree.keys[static_cast<size_t>(t.begin) + j];
      METRALE_CHECK(k > t.root && k < len, op, ": tree: row ", r, " stores key ", t.root + 1 + j,
                    " at index ", k, ", outside (", t.root, ", ", len, ")");
    }
  }
}

void check_weight(std::string_view op, const WeightTensor& w) {
  METRALE_CHECK(w.data != nullptr, op, " '", w.name, "': weight has no data");
  METRALE_CHECK(w.n_out > 0 && w.n_in > 0, op, " '", w.name, "': shape [", w.n_out, ", ", w.n_in,
                "] must be non-empty");
  METRALE_CHECK(w.bias == nullptr || w.bias_dtype == DType::kF32, op, " '", w.name, "': bias is ",
                dtype_name(w.bias_dtype), "; pass the weight through prepare() first");
}

// The recurrent-state slice of a causal_conv / delta_rule call: row_seq indexes s.runs, each
// sequence's rows are consecutive and as many as its run's out blocks, every run with rows
// has an in block and a non-null last out, and runs without rows have no out blocks.
void check_state(std::string_view op, const StateSlice& s, std::span<const int32_t> row_seq,
                 int64_t n_rows) {
  METRALE_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kF16, op, ": state.dtype ",
                dtype_name(s.dtype), " must be f32 or f16");
  const size_t elem = s.dtype == DType::kF32 ? sizeof(float) : sizeof(uint16_t);
  METRALE_CHECK(s.offset % elem == 0, op, ": state.offset ", s.offset,
                " is not a multiple of its element size ", elem);
  check_span({op, "", "row_seq"}, row_seq, n_rows);
  const size_t n_seqs = s.runs.size();
  // Sequences seen so far (a sequence may own one block of consecutive rows only): a bitset
  // on the stack, or past its size a scan of the earlier rows.
  constexpr size_t kBitsetSeqs = size_t{1} << 14;
  uint64_t seen[kBitsetSeqs / 64];
  const bool bitset = n_seqs <= kBitsetSeqs;
  if (bitset) std::fill(seen, seen + (n_seqs + 63) / 64, uint64_t{0});
  for (int64_t r = 0; r < n_rows;) {
    const int32_t q = row_seq[static_cast<size_t>(r)];
    METRALE_CHECK(q >= 0 && static_cast<size_t>(q) < n_seqs, op, ": row_seq[", r,
                  "] names sequence ", q, ", outside the ", n_seqs, " state.runs");
    int64_t e = r + 1;
    while (e < n_rows && row_seq[static_cast<size_t>(e)] == q) ++e;
    const auto uq = static_cast<size_t>(q);
    bool before = false;
    if (bitset) {
      before = ((seen[uq / 64] >> (uq % 64)) & 1) != 0;
      seen[uq / 64] |= uint64_t{1} << (uq % 64);
    } else {
      before = std::find(row_seq.begin(), row_seq.begin() + r, q) != row_seq.begin() + r;
    }
    METRALE_CHECK(!before, op, ": row_seq: the rows of sequence ", q, " are not consecutive (row ",
                  r, " returns to it)");
    const StateRun& run = s.runs[uq];
    METRALE_CHECK(static_cast<int64_t>(run.out.size()) == e - r, op, ": state.runs[", q,
                  "].out has ", run.out.size(), " blocks for the sequence's ", e - r, " rows");
    METRALE_CHECK(run.in != nullptr, op, ": state.runs[", q, "].in is null");
    METRALE_CHECK(run.out.back() != nullptr, op, ": state.runs[", q, "].out: the last block (row ",
                  e - 1, ") is null");
    if (!run.parent.empty()) {
      METRALE_CHECK(run.parent.size() == run.out.size(), op, ": state.runs[", q, "].parent has ",
                    run.parent.size(), " rows for ", run.out.size());
      for (size_t i = 0; i < run.parent.size(); ++i) {
        const int32_t p = run.parent[i];
        METRALE_CHECK(p >= -1 && p < static_cast<int32_t>(i) && run.out[i] != nullptr, op,
                      ": state.runs[", q, "]: tree row ", i, " continues from row ", p,
                      " (expected an earlier row or -1) or keeps no state");
      }
    }
    r = e;
  }
  // Every sequence with rows matched its out count above, so any excess is a run whose
  // sequence has no rows in this call.
  size_t total = 0;
  for (const StateRun& run : s.runs) total += run.out.size();
  if (total != static_cast<size_t>(n_rows)) {
    for (size_t i = 0; i < n_seqs; ++i) {
      METRALE_CHECK(s.runs[i].out.empty() || std::find(row_seq.begin(), row_seq.end(),
                                                       static_cast<int32_t>(i)) != row_seq.end(),
                    op, ": state.runs[", i, "].out has ", s.runs[i].out.size(),
                    " blocks, but the sequence has no rows");
    }
  }
}

}  // namespace

WeightTensor Backend::prepare(const WeightTensor& w, PrepareMode mode) {
  METRALE_CHECK(w.n_out > 0 && w.n_in > 0, "weight '", w.name, "': shape [", w.n_out, ", ", w.n_in,
                "] must be non-empty");
  METRALE_CHECK(w.data != nullptr, "weight '", w.name, "': no data");
  METRALE_CHECK(w.packing == 0, "weight '", w.name, "': already prepared (packing ", w.packing,
                ")");
  require(Op::kLinear, w.format, DType::kF32, w.name);
  validate_quant_params(w.format, w.quant, w.n_out, w.n_in, w.name);
  METRALE_CHECK(w.bias == nullptr || w.bias_dtype == DType::kF32 || w.bias_dtype == DType::kBF16,
                "weight '", w.name, "': bias must be f32 or bf16, found ",
                dtype_name(w.bias_dtype));
  return do_prepare(w, mode);
}

void Backend::check_linear(ConstRows x, const WeightTensor& w, Rows y) const {
  check_weight("linear", w);
  METRALE_CHECK(knows_packing(w), "linear '", w.name, "': unknown packing ", w.packing);
  METRALE_CHECK(supports(Op::kLinear, w.format, DType::kF32), "linear '", w.name,
                "': weight format ", weight_format_name(w.format), " is not supported by the ",
                name(), " backend");
  check_rows({"linear", w.name, "input"}, x, x.n_rows, w.n_in);
  check_rows({"linear", w.name, "output"}, y, x.n_rows, w.n_out);
}

void Backend::linear(ConstRows x, const WeightTensor& w, Rows y) {
  check_linear(x, w, y);
  if (x.n_rows == 0) return;
  const ObservedOp observe(*this, Op::kLinear, &w);
  do_linear(x, w, y);
}

void Backend::linears(std::span<const LinearCall> calls) {
  for (size_t i = 0; i < calls.size(); ++i) {
    METRALE_CHECK(calls[i].w != nullptr, "linears: call ", i, " has no weight");
    check_linear(calls[i].x, *calls[i].w, calls[i].y);
  }
  if (calls.empty()) return;
  const ObservedOp observe(*this, Op::kLinear, calls[0].w);
  do_linears(calls);
}

void Backend::embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out) {
  METRALE_CHECK(table.data != nullptr, "embedding '", table.name, "': table has no data");
  METRALE_CHECK(knows_packing(table), "embedding '", table.name, "': unknown packing ",
                table.packing);
  METRALE_CHECK(supports(Op::kEmbedding, table.format, DType::kF32), "embedding '", table.name,
                "': format ", weight_format_name(table.format), " is not supported by the ", name(),
                " backend");
  check_rows({"embedding", table.name, "output"}, out, static_cast<int64_t>(ids.size()),
             table.n_in);
  for (size_t i = 0; i < ids.size(); ++i) {
    METRALE_CHECK(ids[i] >= 0 && ids[i] < table.n_out, "embedding '", table.name, "': token id ",
                  ids[i], " at index ", i, " is outside the vocabulary [0, ", table.n_out, ")");
  }
  if (ids.empty()) return;
  const ObservedOp observe(*this, Op::kEmbedding, nullptr);
  do_embedding(table, ids, out);
}

void Backend::rms_norm(const RmsNormArgs& a) {
  const int64_t n = a.x.n_cols;
  const int64_t group = a.group > 0 ? a.group : n;
  METRALE_CHECK(n > 0 && group > 0 && n % group == 0, "rms_norm: group ", a.group,
                " must divide the row width ", n);
  METRALE_CHECK(a.weight != nullptr, "rms_norm: no weight");
  METRALE_CHECK(a.eps >= 0.0f, "rms_norm: negative eps ", a.eps);
  check_rows({"rms_norm", "", "input"}, a.x, a.x.n_rows, n);
  check_rows({"rms_norm", "", "output"}, a.out, a.x.n_rows, n);
  if (a.residual.data != nullptr)
    check_rows({"rms_norm", "", "residual"}, a.residual, a.x.n_rows, n);
  if (a.gate.data != nullptr) {
    METRALE_CHECK(a.residual.data == nullptr, "rms_norm: gate and residual cannot be combined");
    check_rows({"rms_norm", "", "gate"}, a.gate, a.x.n_rows, n);
  }
  if (a.x.n_rows == 0) return;
  const ObservedOp observe(*this, Op::kRmsNorm, nullptr);
  do_rms_norm(a);
}

void Backend::rope(const RopeArgs& a) {
  METRALE_CHECK(a.table.cos != nullptr && a.table.sin != nullptr, "rope: no table");
  METRALE_CHECK(a.n_heads > 0 && a.head_dim > 0, "rope: bad head layout ", a.n_heads, " x ",
                a.head_dim);
  METRALE_CHECK(a.table.rotary_dim > 0 && a.table.rotary_dim % 2 == 0 && a.offset >= 0 &&
                    a.offset + a.table.rotary_dim <= a.head_dim,
                "rope: rotary_dim ", a.table.rotary_dim, " must be even and fit head_dim ",
                a.head_dim, " after offset ", a.offset);
  check_rows({"rope", "", "input"}, a.x, a.x.n_rows, a.n_heads * a.head_dim);
  check_span({"rope", "", "positions"}, a.positions, a.x.n_rows);
  for (size_t i = 0; i < a.positions.size(); ++i) {
    METRALE_CHECK(a.positions[i] >= 0 && a.positions[i] < a.table.n_positions, "rope: position ",
                  a.positions[i], " of row ", i, " is outside the table's [0, ",
                  a.table.n_positions, ")");
  }
  if (a.x.n_rows == 0) return;
  const ObservedOp observe(*this, Op::kRope, nullptr);
  do_rope(a);
}

void Backend::kv_store(const KvStoreArgs& a) {
  const KvLayout& kv = a.cache.layout;
  METRALE_CHECK(a.cache.k != nullptr && a.cache.v != nullptr, "kv_store: cache has no memory");
  check_kv_dtype("kv_store", kv);
  const auto n = static_cast<int64_t>(a.slots.size());
  check_rows({"kv_store", "", "k"}, a.k, n, kv.row_elems());
  check_rows({"kv_store", "", "v"}, a.v, n, kv.row_elems());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = a.slots[static_cast<size_t>(i)];
    METRALE_CHECK(slot >= 0 && slot < kv.n_slots(), "kv_store: slot ", slot, " of token ", i,
                  " is outside the cache's [0, ", kv.n_slots(), ")");
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kKvStore, nullptr);
  do_kv_store(a);
}

void Backend::kv_move(const KvMoveArgs& a) {
  const KvLayout& kv = a.cache.layout;
  METRALE_CHECK(a.cache.k != nullptr && (kv.keys_only || a.cache.v != nullptr),
                "kv_move: cache has no memory");
  check_kv_dtype("kv_move", kv);
  METRALE_CHECK(a.from.size() == a.to.size(), "kv_move: ", a.from.size(), " sources for ",
                a.to.size(), " destinations");
  for (size_t i = 0; i < a.from.size(); ++i) {
    METRALE_CHECK(
        a.from[i] >= 0 && a.from[i] < kv.n_slots() && a.to[i] >= 0 && a.to[i] < kv.n_slots(),
        "kv_move: move ", i, " from slot ", a.from[i], " to ", a.to[i], " leaves the cache's [0, ",
        kv.n_slots(), ")");
  }
  if (a.from.empty()) return;
  const ObservedOp observe(*this, Op::kMemory, nullptr);
  do_kv_move(a);
}

void Backend::attention(const AttentionArgs& a) {
  check_attention_shape(a.shape, a.cache.layout, max_head_dim());
  METRALE_CHECK(a.cache.k != nullptr && a.cache.v != nullptr, "attention: cache has no memory");
  check_kv_dtype("attention", a.cache.layout);
  const int64_t width = a.shape.n_heads * a.shape.head_dim;
  const int64_t n = a.q.n_rows;
  check_rows({"attention", "", "q"}, a.q, n, width);
  check_rows({"attention", "", "out"}, a.out, n, width);
  check_span({"attention", "", "row_seq"}, a.row_seq, n);
  check_span({"attention", "", "positions"}, a.positions, n);
  for (size_t i = 0; i < a.seqs.size(); ++i) check_table(a.seqs[i], a.cache.layout, i);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t s = a.row_seq[static_cast<size_t>(r)];
    METRALE_CHECK(s >= 0 && static_cast<size_t>(s) < a.seqs.size(), "attention: row ", r,
                  " names sequence ", s, " of ", a.seqs.size());
    const int32_t p = a.positions[static_cast<size_t>(r)];
    METRALE_CHECK(p >= 0 && p < a.seqs[static_cast<size_t>(s)].seq_len, "attention: row ", r,
                  " at position ", p, " is outside its sequence's ",
                  a.seqs[static_cast<size_t>(s)].seq_len, " stored tokens");
  }
  check_tree("attention", a.tree, a.positions, a.row_seq, a.seqs);
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kAttention, nullptr);
  do_attention(a);
}

void Backend::gated_activation(const GatedActivationArgs& a) {
  check_rows({"gated_activation", "", "gate"}, a.gate, a.gate.n_rows, a.gate.n_cols);
  check_rows({"gated_activation", "", "up"}, a.up, a.gate.n_rows, a.gate.n_cols);
  check_rows({"gated_activation", "", "out"}, a.out, a.gate.n_rows, a.gate.n_cols);
  if (a.gate.n_rows == 0) return;
  const ObservedOp observe(*this, Op::kGatedActivation, nullptr);
  do_gated_activation(a);
}

void Backend::route(const RouteArgs& a) {
  const int64_t n = a.logits.n_rows, e = a.logits.n_cols;
  check_rows({"route", "", "logits"}, a.logits, n, e);
  METRALE_CHECK(a.top_k >= 1 && a.top_k <= e, "route: top_k ", a.top_k, " must be in [1, ", e,
                " experts]");
  check_span({"route", "", "experts"}, a.experts, n * a.top_k);
  check_span({"route", "", "weights"}, a.weights, n * a.top_k);
  if (a.scoring == RouteScoring::kSigmoid) {
    check_span({"route", "", "correction_bias"}, a.correction_bias, e);
    METRALE_CHECK(a.n_group >= 1 && e % a.n_group == 0 && e / a.n_group >= 2, "route: n_group ",
                  a.n_group, " must divide the ", e, " experts into groups of at least 2");
    METRALE_CHECK(a.topk_group >= 1 && a.topk_group <= a.n_group, "route: topk_group ",
                  a.topk_group, " must be in [1, n_group ", a.n_group, "]");
    METRALE_CHECK(a.top_k <= a.topk_group * (e / a.n_group), "route: top_k ", a.top_k,
                  " exceeds the ", a.topk_group * (e / a.n_group), " experts of the kept groups");
  } else {
    METRALE_CHECK(a.n_group == 1 && a.correction_bias.empty() && a.scale == 1.0f,
                  "route: softmax routing takes no groups, correction bias or scale");
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kRoute, nullptr);
  do_route(a);
}

namespace {

// A LoRA pool's weights and each row's slot (in [-1, n_slots), rank within [0, max_rank]), as
// Backend::lora and the MoE op's expert adapters take them. Returns whether any row is adapted.
bool check_lora(const LoraWeights& w, std::span<const int32_t> slots, int64_t n, const char* op) {
  METRALE_CHECK(w.a != nullptr && w.b != nullptr && w.rank != nullptr && w.scale != nullptr, op,
                ": no adapter weights");
  METRALE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16, op, ": LoRA weights of dtype ",
                dtype_name(w.dtype), ", expected f32 or bf16");
  METRALE_CHECK(w.n_slots > 0 && w.n_experts > 0 && w.max_rank > 0, op, ": a LoRA pool of ",
                w.n_slots, " slots x ", w.n_experts, " experts of rank ", w.max_rank);
  check_span({op, "", "lora slots"}, slots, n);
  bool any = false;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t s = slots[static_cast<size_t>(r)];
    METRALE_CHECK(s >= -1 && s < w.n_slots, op, ": row ", r, " has LoRA slot ", s,
                  ", outside [-1, ", w.n_slots, ")");
    if (s < 0) continue;
    const int32_t rank = w.rank[s];
    METRALE_CHECK(rank >= 0 && rank <= w.max_rank, op, ": LoRA slot ", s, " has rank ", rank,
                  ", outside [0, ", w.max_rank, "]");
    any = any || rank > 0;
  }
  return any;
}

}  // namespace

void Backend::moe(const MoeArgs& a) {
  const int64_t n = a.x.n_rows;
  const auto n_experts = static_cast<int64_t>(a.expert_weights.size());
  METRALE_CHECK(n_experts > 0, "moe: no experts");
  const int64_t h = a.expert_weights[0].down.n_out;
  const int64_t inter = a.expert_weights[0].down.n_in;
  for (int64_t e = 0; e < n_experts; ++e) {
    const MoeExpertWeights& w = a.expert_weights[static_cast<size_t>(e)];
    check_weight("moe", w.gate_up);
    check_weight("moe", w.down);
    METRALE_CHECK(w.gate_up.n_out == 2 * inter && w.gate_up.n_in == h && w.down.n_out == h &&
                      w.down.n_in == inter,
                  "moe: expert ", e, " ('", w.gate_up.name, "') is [", w.gate_up.n_out, ", ",
                  w.gate_up.n_in, "] / [", w.down.n_out, ", ", w.down.n_in, "], expected [",
                  2 * inter, ", ", h, "] / [", h, ", ", inter, "]");
    METRALE_CHECK(knows_packing(w.gate_up) && knows_packing(w.down), "moe: expert ", e,
                  ": unknown packing");
    METRALE_CHECK(supports(Op::kMoe, w.gate_up.format, DType::kF32) &&
                      supports(Op::kMoe, w.down.format, DType::kF32),
                  "moe: expert ", e, ": weight format ", weight_format_name(w.gate_up.format),
                  " is not supported by the ", name(), " backend");
  }
  METRALE_CHECK(a.top_k >= 1 && a.top_k <= n_experts, "moe: top_k ", a.top_k, " must be in [1, ",
                n_experts, "]");
  check_rows({"moe", "", "input"}, a.x, n, h);
  check_rows({"moe", "", "output"}, a.out, n, h);
  METRALE_CHECK(a.out.data != a.x.data || n == 0, "moe: out must not alias x");
  check_span({"moe", "", "experts"}, a.experts, n * a.top_k);
  check_span({"moe", "", "weights"}, a.weights, n * a.top_k);
  for (size_t i = 0; i < a.experts.size(); ++i) {
    METRALE_CHECK(a.experts[i] >= 0 && a.experts[i] < n_experts, "moe: row ",
                  static_cast<int64_t>(i) / a.top_k, " chose expert ", a.experts[i],
                  ", outside [0, ", n_experts, ")");
  }
  for (const LoraWeights* l : {a.gate_up_lora, a.down_lora}) {
    if (l == nullptr || a.lora_slots.empty()) continue;  // no slots: every row is the base
    const bool gu = l == a.gate_up_lora;
    METRALE_CHECK(l->n_experts == n_experts && l->n_in == (gu ? h : inter) &&
                      l->n_out == (gu ? 2 * inter : h),
                  "moe: the experts' ", gu ? "gate_up" : "down", " LoRA weights are ", l->n_experts,
                  " x [", l->n_out, ", ", l->n_in, "], expected ", n_experts, " x [",
                  gu ? 2 * inter : h, ", ", gu ? h : inter, "]");
    check_lora(*l, a.lora_slots, n, "moe");
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kMoe, nullptr);
  do_moe(a);
}

void Backend::add(ConstRows x, Rows y) {
  check_rows({"add", "", "x"}, x, x.n_rows, x.n_cols);
  check_rows({"add", "", "y"}, y, x.n_rows, x.n_cols);
  if (x.n_rows == 0) return;
  const ObservedOp observe(*this, Op::kAdd, nullptr);
  do_add(x, y);
}

void Backend::causal_conv(const CausalConvArgs& a) {
  const int64_t n = a.x.n_rows, c = a.x.n_cols;
  METRALE_CHECK(c > 0, "causal_conv: x has no channels");
  METRALE_CHECK(a.kernel >= 2, "causal_conv: kernel ", a.kernel, " must be at least 2");
  METRALE_CHECK(a.weight != nullptr, "causal_conv: no weight");
  check_rows({"causal_conv", "", "x"}, a.x, n, c);
  check_rows({"causal_conv", "", "out"}, a.out, n, c);
  METRALE_CHECK(a.out.data != a.x.data || n == 0, "causal_conv: out must not alias x");
  check_state("causal_conv", a.state, a.row_seq, n);
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kCausalConv, nullptr);
  do_causal_conv(a);
}

void Backend::delta_rule(const DeltaRuleArgs& a) {
  const int64_t n = a.q.n_rows;
  METRALE_CHECK(a.n_k_heads > 0 && a.n_v_heads > 0 && a.n_v_heads % a.n_k_heads == 0,
                "delta_rule: n_v_heads ", a.n_v_heads, " must be a positive multiple of n_k_heads ",
                a.n_k_heads);
  METRALE_CHECK(a.k_head_dim > 0 && a.v_head_dim > 0, "delta_rule: bad head dims k_head_dim ",
                a.k_head_dim, ", v_head_dim ", a.v_head_dim);
  METRALE_CHECK(a.a_log != nullptr, "delta_rule: no a_log");
  METRALE_CHECK(a.dt_bias != nullptr, "delta_rule: no dt_bias");
  const int64_t kw = a.n_k_heads * a.k_head_dim, vw = a.n_v_heads * a.v_head_dim;
  check_rows({"delta_rule", "", "q"}, a.q, n, kw);
  check_rows({"delta_rule", "", "k"}, a.k, n, kw);
  check_rows({"delta_rule", "", "v"}, a.v, n, vw);
  check_rows({"delta_rule", "", "a"}, a.a, n, a.n_v_heads);
  check_rows({"delta_rule", "", "b"}, a.b, n, a.n_v_heads);
  check_rows({"delta_rule", "", "out"}, a.out, n, vw);
  METRALE_CHECK((a.out.data != a.q.data && a.out.data != a.k.data) || n == 0,
                "delta_rule: out must not alias q or k");
  check_state("delta_rule", a.state, a.row_seq, n);
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kDeltaRule, nullptr);
  do_delta_rule(a);
}

void Backend::sigmoid_mul(const SigmoidMulArgs& a) {
  const int64_t n = a.y.n_rows;
  check_rows({"sigmoid_mul", "", "y"}, a.y, n, a.y.n_cols);
  METRALE_CHECK(a.gate.n_cols == a.y.n_cols || a.gate.n_cols == 1, "sigmoid_mul: gate has ",
                a.gate.n_cols, " columns, expected ", a.y.n_cols, " (y's) or 1");
  check_rows({"sigmoid_mul", "", "gate"}, a.gate, n, a.gate.n_cols);
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kSigmoidMul, nullptr);
  do_sigmoid_mul(a);
}

void Backend::latent_attention(const LatentAttentionArgs& a) {
  const KvLayout& kv = a.cache.layout;
  METRALE_CHECK(a.cache.k != nullptr && kv.keys_only && kv.n_kv_heads == 1,
                "latent_attention: the cache must be a keys-only cache of one head");
  check_kv_dtype("latent_attention", kv);
  METRALE_CHECK(a.n_heads > 0 && a.kv_rank > 0 && a.kv_rank < kv.head_dim,
                "latent_attention: ", a.n_heads, " heads of latent width ", a.kv_rank,
                " do not fit the cache's rows of ", kv.head_dim);
  METRALE_CHECK(a.scale > 0.0f, "latent_attention: scale must be positive, found ", a.scale);
  const int64_t n = a.q.n_rows, rope_dim = kv.head_dim - a.kv_rank;
  METRALE_CHECK(a.nope_dim >= 0, "latent_attention: negative nope_dim ", a.nope_dim);
  check_rows({"latent_attention", "", "q_latent"}, a.q_latent, n, a.n_heads * a.kv_rank);
  check_rows({"latent_attention", "", "q"}, a.q, n, a.n_heads * (a.nope_dim + rope_dim));
  check_rows({"latent_attention", "", "kv"}, a.kv, n, kv.head_dim);
  check_rows({"latent_attention", "", "out"}, a.out, n, a.n_heads * a.kv_rank);
  check_span({"latent_attention", "", "slots"}, a.slots, n);
  check_span({"latent_attention", "", "row_seq"}, a.row_seq, n);
  check_span({"latent_attention", "", "positions"}, a.positions, n);
  for (size_t i = 0; i < a.seqs.size(); ++i) check_table(a.seqs[i], kv, i);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t slot = a.slots[static_cast<size_t>(r)];
    METRALE_CHECK(slot >= 0 && slot < kv.n_slots(), "latent_attention: slot ", slot, " of row ", r,
                  " is outside the cache's [0, ", kv.n_slots(), ")");
    const int32_t s = a.row_seq[static_cast<size_t>(r)];
    METRALE_CHECK(s >= 0 && static_cast<size_t>(s) < a.seqs.size(), "latent_attention: row ", r,
                  " names sequence ", s, " of ", a.seqs.size());
    const int32_t p = a.positions[static_cast<size_t>(r)];
    METRALE_CHECK(p >= 0 && p < a.seqs[static_cast<size_t>(s)].seq_len, "latent_attention: row ", r,
                  " at position ", p, " is outside its sequence's ",
                  a.seqs[static_cast<size_t>(s)].seq_len, " stored tokens");
  }
  check_tree("latent_attention", a.tree, a.positions, a.row_seq, a.seqs);
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kLatentAttention, nullptr);
  do_latent_attention(a);
}

void Backend::lora(const LoraArgs& a) {
  METRALE_CHECK(a.weights != nullptr, "lora: no adapter weights");
  const LoraWeights& w = *a.weights;
  METRALE_CHECK(a.expert >= 0 && a.expert < w.n_experts, "lora: expert ", a.expert, " outside [0, ",
                w.n_experts, ")");
  const int64_t n = a.x.n_rows;
  check_rows({"lora", "", "x"}, a.x, n, w.n_in);
  check_rows({"lora", "", "y"}, a.y, n, w.n_out);
  if (!check_lora(w, a.slots, n, "lora")) return;
  const ObservedOp observe(*this, Op::kLora, nullptr);
  do_lora(a);
}

}  // namespace metrale
