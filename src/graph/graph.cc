#include "graph/graph.h"

#include "core/error.h"

namespace metrale {

Tensor Tensor::cols(int64_t c, int64_t n) const {
  METRALE_CHECK(c >= 0 && n >= 0 && c + n <= n_cols, "graph: columns [", c, ", ", c + n,
                ") of a tensor of ", n_cols);
  return {buf, col + c, n};
}

Tensor Graph::buffer(std::string_view name, int64_t width, RowSpace rows, BufferKind kind) {
  METRALE_CHECK(width > 0, "graph: buffer '", name, "' has width ", width);
  std::string full = scope_ < 0 ? std::string(name)
                                : scopes_[static_cast<size_t>(scope_)] + "." + std::string(name);
  buffers_.push_back({.name = std::move(full), .rows = rows, .width = width, .kind = kind});
  return {static_cast<BufferId>(buffers_.size() - 1), 0, width};
}

Graph::Scope::Scope(Graph& g, std::string_view name) : g_(g), outer_(g.scope_) {
  std::string full = outer_ < 0 ? std::string(name)
                                : g.scopes_[static_cast<size_t>(outer_)] + "." + std::string(name);
  g.scopes_.push_back(std::move(full));
  g.scope_ = static_cast<int32_t>(g.scopes_.size() - 1);
}

Graph::Scope::~Scope() { g_.scope_ = outer_; }

void Graph::check(const Tensor& t, std::string_view what) const {
  if (!t.valid()) return;
  METRALE_CHECK(static_cast<size_t>(t.buf) < buffers_.size(), "graph: ", what, " names buffer ",
                t.buf, " of ", buffers_.size());
  const BufferDecl& b = buffers_[static_cast<size_t>(t.buf)];
  METRALE_CHECK(t.col >= 0 && t.n_cols > 0 && t.col + t.n_cols <= b.width, "graph: ", what,
                ": columns [", t.col, ", ", t.col + t.n_cols, ") of '", b.name, "' (width ",
                b.width, ")");
}

void Graph::add(NodeArgs args, When when) {
  if (auto* rope = std::get_if<node::Rope>(&args); rope != nullptr && !rope->cos.valid()) {
    rope->cos = rope_cos_;
    rope->sin = rope_sin_;
  }
  std::vector<Tensor> tensors;
  node_tensors(args, tensors);
  for (const Tensor& t : tensors) check(t, node_name(args));
  nodes_.push_back({.args = std::move(args), .when = when | when_, .scope = scope_});
}

namespace {

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

}  // namespace

std::string_view node_name(const NodeArgs& args) {
  return std::visit(Overloaded{
                        [](const node::GatherWanted&) { return std::string_view("gather_wanted"); },
                        [](const node::Observe&) { return std::string_view("observe"); },
                        [](const node::Linears&) { return std::string_view("linears"); },
                        [&](const auto&) { return op_name(node_op(args)); },
                    },
                    args);
}

Op node_op(const NodeArgs& args) {
  return std::visit(Overloaded{
                        [](const node::Linear&) { return Op::kLinear; },
                        [](const node::Linears&) { return Op::kLinear; },
                        [](const node::Embedding&) { return Op::kEmbedding; },
                        [](const node::RmsNorm&) { return Op::kRmsNorm; },
                        [](const node::Rope&) { return Op::kRope; },
                        [](const node::KvStore&) { return Op::kKvStore; },
                        [](const node::Attention&) { return Op::kAttention; },
                        [](const node::LatentAttention&) { return Op::kLatentAttention; },
                        [](const node::GatedActivation&) { return Op::kGatedActivation; },
                        [](const node::Route&) { return Op::kRoute; },
                        [](const node::Moe&) { return Op::kMoe; },
                        [](const node::Add&) { return Op::kAdd; },
                        [](const node::CausalConv&) { return Op::kCausalConv; },
                        [](const node::DeltaRule&) { return Op::kDeltaRule; },
                        [](const node::SigmoidMul&) { return Op::kSigmoidMul; },
                        [](const node::Lora&) { return Op::kLora; },
                        [](const node::GatherWanted&) { return Op::kGatherRows; },
                        [](const node::TokenOverlay&) { return Op::kTokenOverlay; },
                        [](const node::HeadOverlay&) { return Op::kHeadOverlay; },
                        [](const node::Observe&) { return Op::kMemory; },
                        [](const node::RopeRows&) { return Op::kRopeRows; },
                        [](const node::InjectRows&) { return Op::kScatterRows; },
                        [](const node::LayerNorm&) { return Op::kLayerNorm; },
                        [](const node::Activate&) { return Op::kActivation; },
                        [](const node::VarlenAttention&) { return Op::kVarlenAttention; },
                        [](const node::MergeRows&) { return Op::kMergeRows; },
                        [](const node::GatherRows&) { return Op::kGatherRows; },
                        [](const node::SegmentSum&) { return Op::kSegmentSum; },
                        [](const node::TapSum&) { return Op::kTapSum; },
                    },
                    args);
}

void node_tensors(const NodeArgs& args, std::vector<Tensor>& out) {
  auto add = [&](std::initializer_list<Tensor> ts) {
    for (const Tensor& t : ts)
      if (t.valid()) out.push_back(t);
  };
  std::visit(Overloaded{
                 [&](const node::Linear& n) {
                   add({n.x, n.y});
                 },
                 [&](const node::Linears& n) {
                   for (const auto& c : n.calls) add({c.x, c.y});
                 },
                 [&](const node::Embedding& n) { add({n.out}); },
                 [&](const node::RmsNorm& n) {
                   add({n.x, n.residual, n.gate, n.out});
                 },
                 [&](const node::Rope& n) {
                   add({n.x, n.cos, n.sin});
                 },
                 [&](const node::KvStore& n) {
                   add({n.k, n.v});
                 },
                 [&](const node::Attention& n) {
                   add({n.q, n.out});
                 },
                 [&](const node::LatentAttention& n) {
                   add({n.q_latent, n.q, n.kv, n.out});
                 },
                 [&](const node::GatedActivation& n) {
                   add({n.gate, n.up, n.out});
                 },
                 [&](const node::Route& n) {
                   add({n.logits, n.experts, n.weights});
                 },
                 [&](const node::Moe& n) {
                   add({n.x, n.experts, n.weights, n.out});
                 },
                 [&](const node::Add& n) {
                   add({n.x, n.y});
                 },
                 [&](const node::CausalConv& n) {
                   add({n.x, n.out});
                 },
                 [&](const node::DeltaRule& n) {
                   add({n.q, n.k, n.v, n.a, n.b, n.out});
                 },
                 [&](const node::SigmoidMul& n) {
                   add({n.gate, n.y});
                 },
                 [&](const node::Lora& n) {
                   add({n.x, n.y});
                 },
                 [&](const node::GatherWanted& n) {
                   add({n.x, n.out});
                 },
                 [&](const node::TokenOverlay& n) { add({n.h}); },
                 [&](const node::HeadOverlay& n) {
                   add({n.x, n.logits});
                 },
                 [&](const node::Observe& n) { add({n.x}); },
                 [&](const node::RopeRows& n) {
                   add({n.cos, n.sin});
                 },
                 [&](const node::InjectRows& n) {
                   add({n.x, n.out});
                 },
                 [&](const node::LayerNorm& n) {
                   add({n.x, n.out});
                 },
                 [&](const node::Activate& n) {
                   add({n.x, n.out});
                 },
                 [&](const node::VarlenAttention& n) {
                   add({n.q, n.k, n.v, n.out});
                 },
                 [&](const node::MergeRows& n) {
                   add({n.x, n.out});
                 },
                 [&](const node::GatherRows& n) {
                   add({n.x, n.out});
                 },
                 [&](const node::SegmentSum& n) {
                   add({n.x, n.out});
                 },
                 [&](const node::TapSum& n) { add({n.out}); },
             },
             args);
}

}  // namespace metrale
