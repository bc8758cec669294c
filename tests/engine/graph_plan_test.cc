// Every family's recorded pass: the graph covers the whole model as backend ops (nothing runs
// between them), and its memory plan never lets two live buffers share bytes.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/model.h"
#include "fixture_util.h"

namespace metrale {
namespace {

class GraphPlans : public ::testing::TestWithParam<std::string> {};

TEST_P(GraphPlans, LiveBuffersAreDisjointAndEveryLayerIsRecorded) {
  auto m = Model::load(testing::fixture_dir(GetParam()),
                       {.n_threads = 1, .kv_tokens = 64, .max_rows = 24});
  const Graph& g = m->graph();
  const GraphPlan& p = m->graph_plan();
  const size_t n = g.buffers().size();
  std::vector<int64_t> first(n, -1), last(n, -1);
  std::vector<Tensor> ts;
  std::map<std::string, int> ops;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    ++ops[std::string(node_name(g.nodes()[i].args))];
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
    for (size_t b = a + 1; b < n; ++b) {
      if (p.bytes[b] == 0 || first[a] > last[b] || first[b] > last[a]) continue;
      EXPECT_TRUE(p.offset[a] + p.bytes[a] <= p.offset[b] ||
                  p.offset[b] + p.bytes[b] <= p.offset[a])
          << g.buffers()[a].name << " and " << g.buffers()[b].name;
    }
  }
  EXPECT_LE(p.arena_bytes, p.unshared_bytes);
  const auto L = static_cast<int>(m->config().n_layers);
  EXPECT_EQ(ops["embedding"], 1);
  // h and the pending delta, for the head and for the pooled rows (embeddings).
  EXPECT_EQ(ops["gather_wanted"], 4);
  EXPECT_EQ(ops["segment_sum"], 1);
  // Two norms per layer plus the final one for each epilogue (and per-head / latent / gated
  // norms inside).
  EXPECT_GE(ops["rms_norm"], 2 * L + 2);
  EXPECT_EQ(ops["attention"] + ops["latent_attention"] + ops["delta_rule"], L);
  EXPECT_EQ(ops["observe"], 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GraphPlans,
                         ::testing::Values("llama_f32", "qwen3_f32", "qwen3_moe_f32",
                                           "qwen3_next_f32", "qwen3_5_moe_f32",
                                           "deepseek_v3_mtp_bf16", "glm4_moe_qknorm_bf16",
                                           "quant_ct_w4a16", "qwen2_vl_f32"));

}  // namespace
}  // namespace metrale
