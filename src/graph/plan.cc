#include "graph/plan.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace metrale {

GraphPlan plan_graph(const Graph& g, int64_t max_rows) {
  METRALE_CHECK(max_rows > 0, "plan: max_rows ", max_rows, " must be positive");
  const size_t n = g.buffers().size();
  GraphPlan p;
  p.max_rows = max_rows;
  p.offset.assign(n, -1);
  p.stride.assign(n, 0);
  p.bytes.assign(n, 0);
  // Lifetimes: the first and last node touching each buffer.
  std::vector<int64_t> first(n, -1), last(n, -1);
  std::vector<Tensor> ts;
  const std::span<const Node> nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    ts.clear();
    node_tensors(nodes[i].args, ts);
    for (const Tensor& t : ts) {
      const auto b = static_cast<size_t>(t.buf);
      if (first[b] < 0) first[b] = static_cast<int64_t>(i);
      last[b] = static_cast<int64_t>(i);
    }
  }
  // A gathered buffer may be a view of its source (GatherWanted): the source lives as long.
  for (bool changed = true; changed;) {
    changed = false;
    for (const Node& node : nodes) {
      const auto* gw = std::get_if<node::GatherWanted>(&node.args);
      if (gw == nullptr) continue;
      const auto x = static_cast<size_t>(gw->x.buf), out = static_cast<size_t>(gw->out.buf);
      if (last[out] > last[x]) {
        last[x] = last[out];
        changed = true;
      }
    }
  }
  std::vector<size_t> order;
  for (size_t b = 0; b < n; ++b) {
    const BufferDecl& d = g.buffers()[b];
    switch (d.kind) {
      case BufferKind::kExternal:
        continue;
      case BufferKind::kRows:
        p.stride[b] = padded_cols(d.width);
        break;
      case BufferKind::kPackedF32:
      case BufferKind::kPackedI32:
        p.stride[b] = d.width;
        break;
    }
    if (first[b] < 0) {  // declared, never used
      p.offset[b] = 0;
      continue;
    }
    const auto elems = static_cast<size_t>(max_rows * p.stride[b]);
    p.bytes[b] = static_cast<int64_t>((elems + 15) / 16 * 16 * sizeof(float));
    p.unshared_bytes += static_cast<size_t>(p.bytes[b]);
    order.push_back(b);
  }
  // Largest first, each at the lowest 64-byte offset clear of every placed buffer it is live
  // beside (ties by first use, then declaration: the plan is deterministic).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (p.bytes[a] != p.bytes[b]) return p.bytes[a] > p.bytes[b];
    return first[a] < first[b];
  });
  std::vector<size_t> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of live neighbours
  for (const size_t b : order) {
    busy.clear();
    for (const size_t o : placed) {
      if (first[o] <= last[b] && first[b] <= last[o])
        busy.emplace_back(p.offset[o], p.offset[o] + p.bytes[o]);
    }
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [begin, end] : busy) {
      if (at + p.bytes[b] <= begin) break;
      at = std::max(at, (end + 63) / 64 * 64);
    }
    p.offset[b] = at;
    p.arena_bytes = std::max(p.arena_bytes, static_cast<size_t>(at + p.bytes[b]));
    placed.push_back(b);
  }
  return p;
}

}  // namespace metrale
