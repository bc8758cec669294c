// The recorded graph: its checks, the memory plan's invariants, and the executor's binding of
// passes (conditions, row spaces, the wanted rows as a view or a copy).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "graph/executor.h"
#include "graph/graph.h"
#include "graph/plan.h"

namespace metrale {
namespace {

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

// Every pair of buffers whose lifetimes overlap has disjoint bytes.
void expect_live_buffers_disjoint(const Graph& g, const GraphPlan& p) {
  const size_t n = g.buffers().size();
  std::vector<int64_t> first(n, -1), last(n, -1);
  std::vector<Tensor> ts;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    ts.clear();
    node_tensors(g.nodes()[i].args, ts);
    for (const Tensor& t : ts) {
      const auto b = static_cast<size_t>(t.buf);
      if (first[b] < 0) first[b] = static_cast<int64_t>(i);
      last[b] = static_cast<int64_t>(i);
    }
  }
  for (size_t a = 0; a < n; ++a) {
    if (p.bytes[a] == 0) continue;
    EXPECT_EQ(p.offset[a] % 64, 0) << g.buffers()[a].name;
    EXPECT_LE(static_cast<size_t>(p.offset[a] + p.bytes[a]), p.arena_bytes);
    for (size_t b = a + 1; b < n; ++b) {
      if (p.bytes[b] == 0 || first[a] > last[b] || first[b] > last[a]) continue;
      const bool apart =
          p.offset[a] + p.bytes[a] <= p.offset[b] || p.offset[b] + p.bytes[b] <= p.offset[a];
      EXPECT_TRUE(apart) << g.buffers()[a].name << " and " << g.buffers()[b].name;
    }
  }
}

TEST(Graph, TensorsAreCheckedAgainstTheirBuffers) {
  Graph g;
  const Tensor x = g.buffer("x", 8);
  EXPECT_EQ(x.cols(2, 3).col, 2);
  EXPECT_EQ(error_of([&] { (void)x.cols(6, 3); }), "graph: columns [6, 9) of a tensor of 8");
  Tensor wide = x;
  wide.n_cols = 9;
  EXPECT_EQ(error_of([&] { g.add(node::Add{.x = wide, .y = x}); }),
            "graph: add: columns [0, 9) of 'x' (width 8)");
  EXPECT_EQ(error_of([&] { g.buffer("empty", 0); }), "graph: buffer 'empty' has width 0");
  {
    const Graph::Scope layer(g, "layers.0");
    const Graph::Scope mixer(g, "mixer");
    EXPECT_EQ(g.buffer_decl(g.buffer("qkv", 4).buf).name, "layers.0.mixer.qkv");
    g.add(node::Add{.x = x, .y = x});
  }
  EXPECT_EQ(g.scope_of(g.nodes().back()), "layers.0.mixer");
}

TEST(GraphPlan, LiveBuffersNeverShareBytesAndDeadOnesDo) {
  Graph g;
  const Tensor h = g.buffer("h", 40, RowSpace::kRows, BufferKind::kExternal);
  // A chain of temporaries: each is live only between its write and its read.
  Tensor prev = h;
  for (int i = 0; i < 6; ++i) {
    const Tensor t = g.buffer("t" + std::to_string(i), 40 + 16 * i);
    g.add(node::Add{.x = prev.cols(0, 40), .y = t.cols(0, 40)});
    prev = t;
  }
  g.add(node::Add{.x = prev.cols(0, 40), .y = h});
  const GraphPlan p = plan_graph(g, 10);
  expect_live_buffers_disjoint(g, p);
  EXPECT_EQ(p.offset[static_cast<size_t>(h.buf)], -1);  // external
  EXPECT_LT(p.arena_bytes, p.unshared_bytes);           // t0 and t2 (not live together) share
  EXPECT_EQ(p.stride[1], 48);                           // kRows: padded to 16 floats
  // Deterministic.
  const GraphPlan q = plan_graph(g, 10);
  EXPECT_EQ(p.offset, q.offset);
  EXPECT_EQ(p.arena_bytes, q.arena_bytes);
}

TEST(GraphPlan, AGatheredViewKeepsItsSourceAlive) {
  Graph g;
  const Tensor a = g.buffer("a", 16);
  const Tensor w = g.buffer("w", 16, RowSpace::kWanted);
  const Tensor other = g.buffer("other", 16);
  g.add(node::Add{.x = a, .y = a});
  g.add(node::GatherWanted{.x = a, .out = w});
  g.add(node::Add{.x = other, .y = other});  // a is not touched again, but w may be its view
  g.add(node::Add{.x = w, .y = other});
  const GraphPlan p = plan_graph(g, 4);
  const auto ua = static_cast<size_t>(a.buf), uo = static_cast<size_t>(other.buf);
  EXPECT_TRUE(p.offset[ua] + p.bytes[ua] <= p.offset[uo] ||
              p.offset[uo] + p.bytes[uo] <= p.offset[ua]);
}

class ExecutorTest : public ::testing::Test {
 protected:
  ThreadPool pool_{1};
  CpuBackend be_{pool_};
};

TEST_F(ExecutorTest, ConditionsSelectTheNodesThatRun) {
  Graph g;
  const Tensor h = g.buffer("h", 4, RowSpace::kRows, BufferKind::kExternal);
  const Tensor one = g.buffer("one", 4, RowSpace::kRows, BufferKind::kExternal);
  g.add(node::Add{.x = one, .y = h});                   // +1 always
  g.add(node::Add{.x = one, .y = h}, When::kLoraRows);  // +1 with LoRA rows
  g.add(node::Add{.x = one, .y = h}, When::kEmbedOverlays);
  {
    const Graph::Condition wanted(g, When::kWanted);
    g.add(node::Add{.x = one, .y = h}, When::kHeadOverlays);  // needs both
  }
  const GraphPlan p = plan_graph(g, 2);
  Buffer arena = be_.allocate(std::max<size_t>(p.arena_bytes, 64));
  Executor ex(g, p, arena.data());
  std::vector<float> hv(8, 0.0f), ones(8, 1.0f);
  ex.bind(h.buf, hv.data(), 4);
  ex.bind(one.buf, ones.data(), 4);
  const std::vector<int32_t> lora = {0, -1}, wanted = {1}, wanted_lora = {-1};
  PassInputs in{.n_rows = 2};
  ex.run(be_, in);
  EXPECT_EQ(hv[0], 1.0f);
  in.lora_slots = lora;
  in.embed_overlays = true;
  ex.run(be_, in);
  EXPECT_EQ(hv[0], 4.0f);  // + always, LoRA rows, embed overlays
  in.head_overlays = true;
  ex.run(be_, in);  // head overlays without wanted rows: not run
  EXPECT_EQ(hv[7], 7.0f);
  in.n_wanted = 1;
  in.wanted = wanted;
  in.wanted_lora_slots = wanted_lora;
  ex.run(be_, in);
  EXPECT_EQ(hv[7], 11.0f);
}

TEST_F(ExecutorTest, WantedRowsAreAViewWhenOneRangeAndACopyOtherwise) {
  Graph g;
  const Tensor h = g.buffer("h", 3, RowSpace::kRows, BufferKind::kExternal);
  const Tensor w = g.buffer("w", 3, RowSpace::kWanted);
  const Tensor out = g.buffer("out", 3, RowSpace::kWanted, BufferKind::kExternal);
  g.add(node::GatherWanted{.x = h, .out = w});
  g.add(node::Add{.x = w, .y = out});
  const GraphPlan p = plan_graph(g, 5);
  Buffer arena = be_.allocate(std::max<size_t>(p.arena_bytes, 64));
  Executor ex(g, p, arena.data());
  std::vector<float> hv(5 * 16);
  for (size_t i = 0; i < hv.size(); ++i) hv[i] = static_cast<float>(i);
  ex.bind(h.buf, hv.data(), 16);
  for (const std::vector<int32_t>& wanted :
       {std::vector<int32_t>{2, 3, 4}, std::vector<int32_t>{0, 3, 4}}) {
    std::vector<float> ov(9, 0.0f);
    ex.bind(out.buf, ov.data(), 3);
    ex.run(be_, {.n_rows = 5, .n_wanted = 3, .wanted = wanted});
    for (size_t i = 0; i < 3; ++i)
      for (size_t c = 0; c < 3; ++c)
        EXPECT_EQ(ov[i * 3 + c], hv[static_cast<size_t>(wanted[i]) * 16 + c]);
  }
  EXPECT_EQ(error_of([&] { ex.run(be_, {.n_rows = 6}); }),
            "executor: a pass of 6 rows (0 wanted, 0 pooled into 0) exceeds the plan's 5 rows");
}

TEST_F(ExecutorTest, PooledRowsGatherThenSumPerPoolOnlyInPooledPasses) {
  Graph g;
  const Tensor h = g.buffer("h", 3, RowSpace::kRows, BufferKind::kExternal);
  const Tensor x = g.buffer("x", 3, RowSpace::kPoolRows);
  const Tensor sums = g.buffer("sums", 3, RowSpace::kPools, BufferKind::kExternal);
  {
    const Graph::Condition pooled(g, When::kPooled);
    g.add(node::GatherWanted{.x = h, .out = x});
    g.add(node::SegmentSum{.x = x, .out = sums});
  }
  const GraphPlan p = plan_graph(g, 5);
  Buffer arena = be_.allocate(std::max<size_t>(p.arena_bytes, 64));
  Executor ex(g, p, arena.data());
  std::vector<float> hv(5 * 16);
  for (size_t i = 0; i < hv.size(); ++i) hv[i] = static_cast<float>(i);
  ex.bind(h.buf, hv.data(), 16);
  // Pool 0: rows 1 and 2 (one range, a view); pool 1: row 4. Then rows 0 and 3 (a copy).
  const std::vector<int32_t> rows = {1, 2, 4}, offsets = {0, 2, 3};
  std::vector<float> out(6, 1.0f);
  ex.bind(sums.buf, out.data(), 3);
  ex.run(be_,
         {.n_rows = 5, .n_pool_rows = 3, .n_pools = 2, .pool_rows = rows, .pool_offsets = offsets});
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(out[c], 1.0f + hv[16 + c] + hv[32 + c]);
    EXPECT_EQ(out[3 + c], 1.0f + hv[64 + c]);
  }
  std::vector<float> before = out;
  ex.run(be_, {.n_rows = 5});  // no pooling: the nodes do not run
  EXPECT_EQ(out, before);
  const std::vector<int32_t> apart = {0, 3}, one = {0, 2};
  std::vector<float> single(3, 0.0f);
  ex.bind(sums.buf, single.data(), 3);
  ex.run(be_,
         {.n_rows = 5, .n_pool_rows = 2, .n_pools = 1, .pool_rows = apart, .pool_offsets = one});
  for (size_t c = 0; c < 3; ++c) EXPECT_EQ(single[c], hv[c] + hv[48 + c]);
}

}  // namespace
}  // namespace metrale
