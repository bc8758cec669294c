#pragma once
// Graph: one pass of a model written as data — a list of backend ops over named buffers.
//
// Blocks do not call the backend; they record what they would call (Mixer::record,
// Ffn::record, Linear::record) into a Graph at load time. A buffer is a named activation with a
// row count given by the pass (one row per token of the step, or one per logits row it asks
// for) and a fixed width; a Tensor is a column range of one. Everything that varies per pass
// — the token ids, positions, KV slots, page tables, recurrent-state blocks, LoRA slots, which
// rows want logits — is a pass input the executor binds (executor.h), so one recorded graph
// serves every step shape. The layer loop is "run the graph op by op" (Executor); the plan
// (plan.h) gives every intermediate a fixed offset in one arena; the circuit compiler reads
// the same nodes.
//
// Nothing runs between nodes: a row gather, the LoRA token overlays, a residual add are
// nodes too, so a device backend (which host code cannot reach into) runs a pass as it is.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "backend/backend.h"

namespace metrale {

// How many rows a buffer has in a pass.
enum class RowSpace : uint8_t {
  kRows,      // one per row (token) of the pass
  kWanted,    // one per logits row the pass asks for
  kInjected,  // one per row whose input embedding the caller supplies (image features)
  kMerged,    // one per merged row of a vision tower's pass (merge_size^2 patches each)
  kPoolRows,  // one per row whose final hidden state is pooled (embeddings)
  kPools,     // one per pooled output (an embedding input's sum of its pooled rows)
};

enum class BufferKind : uint8_t {
  kRows,       // f32 rows, stride padded to 16 floats (64-byte aligned rows)
  kPackedF32,  // f32, stride = width: one span of n_rows * width (MoE routing weights)
  kPackedI32,  // i32, stride = width (MoE routing choices)
  kExternal,   // f32 rows bound per pass by the caller (the residual stream, the logits)
};

using BufferId = int32_t;

struct BufferDecl {
  std::string name;
  RowSpace rows = RowSpace::kRows;
  int64_t width = 0;
  BufferKind kind = BufferKind::kRows;
};

// Columns [col, col + n_cols) of every row of buffer `buf`.
struct Tensor {
  BufferId buf = -1;
  int64_t col = 0;
  int64_t n_cols = 0;

  bool valid() const { return buf >= 0; }
  // Columns [col, col + n) of this tensor (checked against its width).
  Tensor cols(int64_t c, int64_t n) const;
};

// When a node runs: a bit set of conditions on the pass, all of which must hold. A pass without
// LoRA rows skips the adapter nodes; one whose slots hold no token overlays skips those; a
// pass that asks for no logits skips the head.
enum class When : uint8_t {
  kAlways = 0,
  kLoraRows = 1,       // some row of the pass has a LoRA slot
  kEmbedOverlays = 2,  // some row's adapter overlays embedding rows
  kHeadOverlays = 4,   // some wanted row's adapter overlays the logits
  kWanted = 8,         // the pass asks for logits
  kInjected = 16,      // the pass injects input embeddings into some rows
  kPooled = 32,        // the pass pools some rows' final hidden states (embeddings)
};
inline When operator|(When a, When b) {
  return static_cast<When>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}
inline bool has(When set, When bit) {
  return (static_cast<uint8_t>(set) & static_cast<uint8_t>(bit)) != 0;
}

// The nodes: one per backend op, each the op's arguments with Tensors for activations and
// pass inputs implied (positions, slots, row_seq and the page tables of the pass; `layer`
// names whose KV pages / recurrent state).
namespace node {

struct Linear {
  Tensor x;
  const WeightTensor* w = nullptr;
  Tensor y;
};
struct Linears {  // Backend::linears: many products in one dispatch (MLA's per-head matrices)
  struct Call {
    Tensor x;
    const WeightTensor* w = nullptr;
    Tensor y;
  };
  std::vector<Call> calls;
};
struct Embedding {  // rows of `table` for the pass's token ids
  const WeightTensor* table = nullptr;
  Tensor out;
};
struct RmsNorm {
  Tensor x;
  Tensor residual;  // optional: residual += x, then the norm reads residual
  Tensor out;
  const float* weight = nullptr;
  float eps = 1e-6f;
  NormStyle style = NormStyle::kWeight;
  int64_t group = 0;
  Tensor gate;  // optional: RMSNormGated
};
// The pass's per-row cos/sin for multimodal rope (Backend::rope_rows) from its (t, h, w)
// positions; the graph's Rope nodes then read these rows (Graph::set_rope_rows).
struct RopeRows {
  Tensor cos, sin;  // [rows, half]
  const float* inv_freq = nullptr;
  const int32_t* axes = nullptr;
  int64_t half = 0;
  float scaling = 1.0f;
};
// The caller's embeddings (a kInjected buffer) replace the rows of `out` they are for
// (Backend::scatter_rows), or are added to them (add: Qwen3-VL's deepstack features).
struct InjectRows {
  Tensor x, out;
  bool add = false;
};
struct Rope {  // over the pass's positions and the model's rope table
  Tensor x;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t offset = 0;
  bool pairs = false;
  // Per-row cos/sin (a RopeRows node's) instead of the table: row r rotates by row r of them.
  // Filled in by Graph::add when the graph has rope rows (set_rope_rows).
  Tensor cos, sin;
};
struct KvStore {  // at the pass's KV slots
  Tensor k, v;
  int32_t layer = 0;
};
struct Attention {  // over the pass's sequences
  Tensor q, out;
  int32_t layer = 0;
  AttentionShape shape;
};
struct LatentAttention {
  Tensor q_latent, q;
  int64_t nope_dim = 0;
  Tensor kv, out;
  int32_t layer = 0;
  int64_t n_heads = 0;
  int64_t kv_rank = 0;
  float scale = 0.0f;
};
struct GatedActivation {
  Tensor gate, up, out;
  Activation act = Activation::kSilu;
};
struct Route {
  Tensor logits;
  int64_t top_k = 0;
  bool normalize = false;
  Tensor experts;  // kPackedI32 [rows, top_k]
  Tensor weights;  // kPackedF32 [rows, top_k]
  RouteScoring scoring = RouteScoring::kSoftmax;
  std::span<const float> correction_bias;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  float scale = 1.0f;
};
struct Moe {  // LoRA slots: the pass's, when it has LoRA rows
  Tensor x, experts, weights;
  int64_t top_k = 0;
  std::span<const MoeExpertWeights> expert_weights;
  Activation act = Activation::kSilu;
  Tensor out;
  const LoraWeights* gate_up_lora = nullptr;
  const LoraWeights* down_lora = nullptr;
};
struct Add {  // y += x
  Tensor x, y;
};
struct CausalConv {
  Tensor x, out;
  const float* weight = nullptr;
  int64_t kernel = 0;
  bool silu = true;
  int32_t layer = 0;
};
struct DeltaRule {
  Tensor q, k, v, a, b;
  const float* a_log = nullptr;
  const float* dt_bias = nullptr;
  int64_t n_k_heads = 0, n_v_heads = 0, k_head_dim = 0, v_head_dim = 0;
  Tensor out;
  int32_t layer = 0;
};
struct SigmoidMul {
  Tensor gate, y;
};
struct Lora {  // slots: the pass's per row, or per wanted row for a kWanted x
  Tensor x, y;
  const LoraWeights* weights = nullptr;
};
// out = x's wanted rows: the rows that want logits when out is a kWanted buffer, the rows
// that are pooled when it is a kPoolRows one. The executor makes out a view of x instead when
// those rows are one range (a decode step, a prefill chunk's last row, one input's rows for
// mean pooling), so most passes copy nothing.
struct GatherWanted {
  Tensor x, out;
};
// out[s] += the rows of x in pooled output s (Backend::segment_sum over the pass's
// pool_offsets): x a kPoolRows buffer, out a kPools one.
struct SegmentSum {
  Tensor x, out;
};
struct TokenOverlay {
  Tensor h;
  std::span<const LoraSlotOverlay> overlays;
};
struct HeadOverlay {
  Tensor x, logits;
  std::span<const LoraSlotOverlay> overlays;
};
// The vision towers' ops (a tower's graph: one row per patch).
struct LayerNorm {
  Tensor x, out;
  const float* weight = nullptr;
  const float* bias = nullptr;
  float eps = 1e-5f;
};
struct Activate {  // Backend::activation
  Tensor x, out;
  Activation act = Activation::kGelu;
};
// Non-causal attention within the pass's segments (PassInputs::cu_seqlens, or its windows'
// cu_window_seqlens: Qwen2.5-VL's window attention).
struct VarlenAttention {
  Tensor q, k, v, out;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;
  bool windows = false;
};
// out[i] = x[list[i]] over one of the pass's row lists (Backend::gather_rows): a vision tower's
// window order (Qwen2.5-VL) and its inverse on the merged rows.
enum class RowList : uint8_t {
  kWindowRows,     // PassInputs::window_rows
  kMergedInverse,  // PassInputs::merged_inverse
};
struct GatherRows {
  Tensor x, out;
  RowList list = RowList::kWindowRows;
};
// out[r] += the learned table's rows at the pass's pos_taps, weighted by its pos_weights
// (Backend::tap_sum; Qwen3-VL's interpolated position embeddings).
struct TapSum {
  Tensor out;
  const float* table = nullptr;  // [table_rows, out's width]
  int64_t table_rows = 0;
  int64_t n_taps = 0;
};
// out (kMerged rows) = groups of x's consecutive rows side by side (Backend::merge_rows).
struct MergeRows {
  Tensor x, out;
};
// Hands `x` to the pass's observer as hidden state `index` (HiddenSink: 0 after the
// embedding, i after layer i, L after the final norm).
struct Observe {
  Tensor x;
  int32_t index = 0;
};

}  // namespace node

using NodeArgs =
    std::variant<node::Linear, node::Linears, node::Embedding, node::RmsNorm, node::Rope,
                 node::KvStore, node::Attention, node::LatentAttention, node::GatedActivation,
                 node::Route, node::Moe, node::Add, node::CausalConv, node::DeltaRule,
                 node::SigmoidMul, node::Lora, node::GatherWanted, node::TokenOverlay,
                 node::HeadOverlay, node::Observe, node::RopeRows, node::InjectRows,
                 node::LayerNorm, node::Activate, node::VarlenAttention, node::MergeRows,
                 node::GatherRows, node::SegmentSum, node::TapSum>;

struct Node {
  NodeArgs args;
  When when = When::kAlways;
  int32_t scope = -1;  // index into Graph::scopes() (for inspect and profiles)
};

// What a graph is recorded for.
// A multimodal rope's frequencies (in backend memory): which axis (t, h, w) each of the
// rotary_dim / 2 frequencies follows.
struct MropeSpec {
  const float* inv_freq = nullptr;  // [half]
  const int32_t* axes = nullptr;    // [half]
  int64_t half = 0;
  float scaling = 1.0f;
};

struct RecordOptions {
  // Emit Observe nodes (and materialise the residual stream after each layer for them).
  bool observe = false;
  // Multimodal rope (null: the 1-D table): the prologue computes each row's cos/sin.
  const MropeSpec* mrope = nullptr;
};

class Graph {
 public:
  // --- recording ---
  // A new buffer named scope + "." + name.
  Tensor buffer(std::string_view name, int64_t width, RowSpace rows = RowSpace::kRows,
                BufferKind kind = BufferKind::kRows);
  // Nodes and buffers recorded inside a Scope get its name ("layers.3.self_attn").
  class Scope {
   public:
    Scope(Graph& g, std::string_view name);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Graph& g_;
    int32_t outer_;
  };
  // Appends a node (its tensors checked against their buffers' widths); it runs when `when`
  // and every condition of the enclosing Condition scopes hold.
  void add(NodeArgs args, When when = When::kAlways);
  // Nodes added while one lives also need `when` (the head: When::kWanted).
  class Condition {
   public:
    Condition(Graph& g, When when) : g_(g), outer_(g.when_) { g.when_ = g.when_ | when; }
    ~Condition() { g_.when_ = outer_; }
    Condition(const Condition&) = delete;
    Condition& operator=(const Condition&) = delete;

   private:
    Graph& g_;
    When outer_;
  };

  // Rope nodes added from now on read these per-row cos/sin (written by a RopeRows node)
  // instead of the model's table.
  void set_rope_rows(Tensor cos, Tensor sin) {
    rope_cos_ = cos;
    rope_sin_ = sin;
  }
  const Tensor& rope_cos() const { return rope_cos_; }
  const Tensor& rope_sin() const { return rope_sin_; }

  // --- reading ---
  std::span<const BufferDecl> buffers() const { return buffers_; }
  const BufferDecl& buffer_decl(BufferId id) const { return buffers_[static_cast<size_t>(id)]; }
  std::span<const Node> nodes() const { return nodes_; }
  std::span<const std::string> scopes() const { return scopes_; }
  std::string_view scope_of(const Node& n) const {
    return n.scope < 0 ? std::string_view()
                       : std::string_view(scopes_[static_cast<size_t>(n.scope)]);
  }

 private:
  void check(const Tensor& t, std::string_view what) const;

  std::vector<BufferDecl> buffers_;
  std::vector<Node> nodes_;
  std::vector<std::string> scopes_;
  int32_t scope_ = -1;
  When when_ = When::kAlways;
  Tensor rope_cos_, rope_sin_;
};

// The Op a node runs (kMemory for Observe), and a short name ("linear", "gather_wanted").
Op node_op(const NodeArgs& args);
std::string_view node_name(const NodeArgs& args);
// The tensors a node reads and writes, for the planner's lifetimes (order: as declared).
void node_tensors(const NodeArgs& args, std::vector<Tensor>& out);

}  // namespace metrale
