// The circuit's fusions (circuit/fusion.h), each on a small hand-recorded decode graph:
// norm -> gate|up linear -> gated activation -> down linear -> residual norm -> head. Under every
// policy the program's logits and residual stream equal the layer loop's bit for bit, and both
// stay within 1e-5 (relative) of a scalar reference written here; a pair the policy allows but
// cannot form runs unfused and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "circuit/fusion.h"
#include "circuit/program.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "graph/executor.h"
#include "graph/graph.h"
#include "graph/plan.h"

namespace metrale {
namespace {

constexpr int64_t kH = 48, kV = 40, kW = 2;
constexpr float kEps = 1e-6f;

std::vector<float> values(size_t n, float scale, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = scale * std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(seed));
  return v;
}

WeightTensor f32_weight(const std::vector<float>& w, int64_t n_out, int64_t n_in) {
  return {
      .name = "w", .format = WeightFormat::kF32, .n_out = n_out, .n_in = n_in, .data = w.data()};
}

// The graph and its weights; I is the intermediate size.
struct Net {
  int64_t I;
  std::vector<float> norm_w, gate_up, down, head;
  WeightTensor gate_up_w, down_w, head_w;
  Graph g;
  Tensor h, logits;

  explicit Net(int64_t intermediate)
      : I(intermediate),
        norm_w(values(kH, 0.5f, 1)),
        gate_up(values(static_cast<size_t>(2 * I * kH), 0.2f, 2)),
        down(values(static_cast<size_t>(kH * I), 0.2f, 3)),
        head(values(static_cast<size_t>(kV * kH), 0.3f, 4)),
        gate_up_w(f32_weight(gate_up, 2 * I, kH)),
        down_w(f32_weight(down, kH, I)),
        head_w(f32_weight(head, kV, kH)) {
    for (float& w : norm_w) w += 1.0f;
    h = g.buffer("h", kH, RowSpace::kRows, BufferKind::kExternal);
    logits = g.buffer("logits", kV, RowSpace::kWanted, BufferKind::kExternal);
    const Tensor n = g.buffer("n", kH), gu = g.buffer("gate_up", 2 * I), t = g.buffer("t", kH);
    const Tensor n2 = g.buffer("n2", kH), nw = g.buffer("nw", kH, RowSpace::kWanted);
    g.add(node::RmsNorm{.x = h, .out = n, .weight = norm_w.data(), .eps = kEps});
    g.add(node::Linear{.x = n, .w = &gate_up_w, .y = gu});
    g.add(node::GatedActivation{.gate = gu.cols(0, I), .up = gu.cols(I, I), .out = gu.cols(0, I)});
    g.add(node::Linear{.x = gu.cols(0, I), .w = &down_w, .y = t});
    g.add(node::RmsNorm{.x = t, .residual = h, .out = n2, .weight = norm_w.data(), .eps = kEps});
    {
      const Graph::Condition wanted(g, When::kWanted);
      g.add(node::GatherWanted{.x = n2, .out = nw});
      g.add(node::Linear{.x = nw, .w = &head_w, .y = logits});
    }
  }
};

// The same step in plain scalar loops: h is updated in place, the logits returned.
std::vector<float> reference(const Net& net, std::vector<float>& h) {
  auto norm = [&](const float* x) {
    double ss = 0;
    for (int64_t i = 0; i < kH; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / kH + kEps);
    std::vector<double> y(kH);
    for (int64_t i = 0; i < kH; ++i)
      y[static_cast<size_t>(i)] = x[i] * inv * net.norm_w[static_cast<size_t>(i)];
    return y;
  };
  auto dot = [](const float* w, const std::vector<double>& x) {
    double s = 0;
    for (size_t k = 0; k < x.size(); ++k) s += w[k] * x[k];
    return s;
  };
  std::vector<float> out;
  for (int64_t r = 0; r < kW; ++r) {
    float* hr = h.data() + r * kH;
    const std::vector<double> n = norm(hr);
    std::vector<double> act(static_cast<size_t>(net.I));
    for (int64_t o = 0; o < net.I; ++o) {
      const double gte = dot(net.gate_up.data() + o * kH, n);
      const double up = dot(net.gate_up.data() + (net.I + o) * kH, n);
      act[static_cast<size_t>(o)] = gte / (1.0 + std::exp(-gte)) * up;
    }
    for (int64_t o = 0; o < kH; ++o)
      hr[o] = static_cast<float>(hr[o] + dot(net.down.data() + o * net.I, act));
    const std::vector<double> n2 = norm(hr);
    for (int64_t v = 0; v < kV; ++v)
      out.push_back(static_cast<float>(dot(net.head.data() + v * kH, n2)));
  }
  return out;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5f * scale) << what << " [" << i << "]";
}

struct Step {
  std::vector<float> logits, h;
};

class Fusion : public ::testing::TestWithParam<int64_t> {
 protected:
  ThreadPool pool_{2};
  CpuBackend be_{pool_};
};

TEST_P(Fusion, EveryPolicyEqualsTheLayerLoopAndTheScalarReference) {
  Net net(GetParam());
  const GraphPlan plan = plan_graph(net.g, kW);
  Buffer arena = be_.allocate(std::max<size_t>(plan.arena_bytes, 64));
  Executor ex(net.g, plan, arena.data());
  const std::vector<float> h0 = values(static_cast<size_t>(kW * kH), 2.0f, 5);
  std::vector<float> h = h0;
  ex.bind(net.h.buf, h.data(), kH);
  const std::vector<int32_t> rows = {0, 1}, positions = {0, 0};
  const std::vector<int64_t> slots = {0, 1};
  const std::vector<KvPageTable> seqs(kW);
  const PassInputs in{.n_rows = kW,
                      .n_wanted = kW,
                      .positions = positions,
                      .row_index = rows,
                      .row_seq = rows,
                      .slots = slots,
                      .wanted = rows,
                      .seqs = seqs};
  // The layer loop's step.
  std::vector<float> want(static_cast<size_t>(kW * kV));
  ex.bind(net.logits.buf, want.data(), kV);
  ex.run(be_, in);
  const std::vector<float> want_h = h;
  std::vector<float> ref_h = h0;
  const std::vector<float> ref = reference(net, ref_h);
  expect_near_all(want, ref, "layer loop vs the scalar reference");
  expect_near_all(want_h, ref_h, "layer loop's residual vs the scalar reference");

  const bool aligned = net.I % cpu::kLinearUnit == 0;
  for (const char* policy : {"none", "residual", "gate_up", "norm", "residual,norm", "default"}) {
    const FusionPolicy f = parse_fusion(policy);
    Program p(net.g, plan, ex, be_, kW, {.logits = net.logits.buf}, f);
    std::copy(h0.begin(), h0.end(), h.begin());
    std::vector<float> got(want.size(), -1.0f);
    p.run(in, got.data(), kV);
    EXPECT_EQ(got, want) << policy;
    EXPECT_EQ(h, want_h) << policy;
    const Program::Stats& s = p.stats();
    EXPECT_EQ(s.fused_residual, f.residual ? 1 : 0) << policy;
    EXPECT_EQ(s.fused_gate_up, f.gate_up && aligned ? 1 : 0) << policy;
    // The first norm always; the second once the residual add left it.
    EXPECT_EQ(s.fused_norm, f.norm ? (f.residual ? 2 : 1) : 0) << policy;
    const std::string notes = [&] {
      std::string all;
      for (const std::string& n : p.fusion_notes()) all += n + "\n";
      return all;
    }();
    EXPECT_EQ(notes.find("gate_up: the intermediate size") != std::string::npos,
              f.gate_up && !aligned)
        << notes;
    EXPECT_EQ(notes.find("norm: it adds a residual") != std::string::npos, f.norm && !f.residual)
        << notes;
    // Fewer ops run apart, so no more barriers than without fusions.
    Program none(net.g, plan, ex, be_, kW, {.logits = net.logits.buf});
    EXPECT_LE(s.barriers, none.stats().barriers) << policy;
  }
}

// 32: every pair forms; 24: gate|up cannot be split at the kernel's 16-output units and runs
// unfused (stated).
INSTANTIATE_TEST_SUITE_P(Intermediate, Fusion, ::testing::Values(int64_t{32}, int64_t{24}));

TEST(FusionPolicy, ParsesNamesStrictly) {
  EXPECT_FALSE(parse_fusion("none").any());
  const FusionPolicy d = parse_fusion("default");
  EXPECT_TRUE(d.residual && d.gate_up && d.norm);
  const FusionPolicy l = parse_fusion("norm,residual");
  EXPECT_TRUE(l.residual && l.norm && !l.gate_up);
  EXPECT_EQ(fusion_name(l), "residual,norm");
  EXPECT_EQ(fusion_name(d), "default");
  EXPECT_EQ(fusion_name(FusionPolicy{}), "none");
  for (const char* bad : {"fused", "norm,", "", "residual,rope"}) {
    try {
      parse_fusion(bad, "--fusion");
      FAIL() << "no error for '" << bad << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--fusion"), std::string::npos) << what;
      EXPECT_NE(what.find("residual, gate_up, norm"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace metrale
