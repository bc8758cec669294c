// The circuit executor (circuit/program.h): with the layer loop's exact ops (no fusions), a
// compiled decode program's logits equal the layer loop's bit for bit — on every fixture family
// and weight format, at 1 and 2 threads, one sequence alone and co-batched — and a step no
// program takes (another width, a prefill chunk) runs the layer loop. With the default fusion
// policy (circuit/fusion.h) they stay within 1e-5 relative of the layer loop's (the policy's
// contract; today's fusions are exact, and that is asserted too), and greedy continuations are
// identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "backend/op_profiler.h"
#include "circuit/program.h"
#include "core/error.h"
#include "engine/model.h"
#include "fixture_util.h"

namespace metrale {
namespace {

using testing::Reference;

std::string fixture_of(const std::string& param) { return param.substr(0, param.find('@')); }

std::unique_ptr<Model> load(const std::string& param, int threads, ExecutorKind executor,
                            FusionPolicy fusion = {}) {
  LoadOptions o;
  o.fusion = fusion;
  o.n_threads = threads;
  o.kv_tokens = 512;
  o.max_rows = 8;
  o.executor = executor;
  o.compute = param.ends_with("@bf16")   ? Compute::kBF16
              : param.ends_with("@int8") ? Compute::kInt8
                                         : Compute::kF32;
  return Model::load(testing::fixture_dir(fixture_of(param)), o);
}

class CircuitEquality : public ::testing::TestWithParam<std::string> {};

TEST_P(CircuitEquality, ProgramLogitsEqualTheLayerLoop) {
  const Reference ref(fixture_of(GetParam()));
  const std::vector<int32_t> a = ref.ids("input_ids"), b = ref.ids("input_ids_b"),
                             g = ref.ids("greedy_ids");
  for (const int threads : {1, 2}) {
    auto layers = load(GetParam(), threads, ExecutorKind::kLayers);
    auto circuit = load(GetParam(), threads, ExecutorKind::kCircuit);
    auto fused = load(GetParam(), threads, ExecutorKind::kCircuit, FusionPolicy::all());
    ASSERT_EQ(circuit->programs().size(), 4u);  // widths 1, 2, 4, 8
    const auto V = static_cast<size_t>(layers->vocab_size());
    // The same steps on both models; every call's logits compared.
    std::vector<Sequence> sl(4), sc(4), sf(4);
    const std::vector<int32_t> prompts[] = {a, b, std::vector<int32_t>(b.begin(), b.begin() + 5),
                                            std::vector<int32_t>(a.begin(), a.begin() + 3)};
    std::vector<float> want(4 * V), got(4 * V), got_fused(4 * V);
    for (size_t i = 0; i < 4; ++i) {
      layers->prefill(sl[i], prompts[i], std::span(want).first(V));
      circuit->prefill(sc[i], prompts[i], std::span(got).first(V));
      fused->prefill(sf[i], prompts[i], std::span(got_fused).first(V));
      ASSERT_EQ(got, want) << "prefill " << i;  // prefill is the layer loop's in both
      ASSERT_EQ(got_fused, want) << "prefill " << i;
    }
    const int64_t prefill_layer_steps = circuit->layer_steps();
    auto step = [&](std::initializer_list<size_t> which, std::vector<int32_t> tokens,
                    const std::string& what) {
      std::vector<Sequence*> pl, pc, pf;
      for (size_t i : which) {
        pl.push_back(&sl[i]);
        pc.push_back(&sc[i]);
        pf.push_back(&sf[i]);
      }
      const size_t n = pl.size();
      layers->decode(pl, tokens, std::span(want).first(n * V));
      circuit->decode(pc, tokens, std::span(got).first(n * V));
      fused->decode(pf, tokens, std::span(got_fused).first(n * V));
      const auto end = static_cast<long>(n * V);
      EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + end),
                std::vector<float>(want.begin(), want.begin() + end))
          << what << " at " << threads << " threads";
      for (size_t r = 0; r < n; ++r) {
        float scale = 0.0f;
        for (size_t v = 0; v < V; ++v) scale = std::max(scale, std::abs(want[r * V + v]));
        for (size_t v = 0; v < V; ++v) {
          ASSERT_NEAR(got_fused[r * V + v], want[r * V + v], 1e-5f * scale)
              << what << ", fused, row " << r << " logit " << v << " at " << threads << " threads";
        }
      }
      EXPECT_EQ(std::vector<float>(got_fused.begin(), got_fused.begin() + end),
                std::vector<float>(want.begin(), want.begin() + end))
          << what << ", fused (exact today) at " << threads << " threads";
    };
    for (size_t s = 0; s < 4; ++s) {
      step({0}, {g[s]}, "alone, step " + std::to_string(s));
      step({1, 0}, {7, g[s + 4]}, "co-batched by 2, step " + std::to_string(s));
      step({2, 1, 0, 3}, {11, 13, g[s + 8], 17}, "co-batched by 4, step " + std::to_string(s));
      step({3, 2, 1}, {19, 23, 29}, "3 rows (the layer loop), step " + std::to_string(s));
    }
    EXPECT_EQ(circuit->circuit_steps(), 12);                     // widths 1, 2 and 4 ran a program
    EXPECT_EQ(circuit->layer_steps() - prefill_layer_steps, 4);  // width 3 did not
    EXPECT_EQ(layers->circuit_steps(), 0);
    EXPECT_EQ(fused->circuit_steps(), 12);
    for (size_t i = 0; i < 4; ++i) {
      layers->release(sl[i]);
      circuit->release(sc[i]);
      fused->release(sf[i]);
    }
    // Greedy continuations: each model feeds back its own argmax.
    Sequence gl, gf;
    layers->prefill(gl, a, std::span(want).first(V));
    fused->prefill(gf, a, std::span(got_fused).first(V));
    for (int s = 0; s < 6; ++s) {
      const auto tl =
          static_cast<int32_t>(std::max_element(want.begin(), want.begin() + V) - want.begin());
      const auto tf = static_cast<int32_t>(
          std::max_element(got_fused.begin(), got_fused.begin() + V) - got_fused.begin());
      ASSERT_EQ(tf, tl) << "greedy token " << s << " at " << threads << " threads";
      std::vector<Sequence*> one_l{&gl}, one_f{&gf};
      layers->decode(one_l, std::vector<int32_t>{tl}, std::span(want).first(V));
      fused->decode(one_f, std::vector<int32_t>{tf}, std::span(got_fused).first(V));
    }
    layers->release(gl);
    fused->release(gf);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CircuitEquality,
    ::testing::Values("qwen3_f32", "llama_bf16", "qwen2_f32", "qwen3_bf16@bf16", "llama_bf16@bf16",
                      "qwen3_moe_f32", "qwen3_moe_nonorm_f32", "qwen3_moe_bf16@bf16",
                      "qwen3_next_f32", "qwen3_5_text_bf16@bf16", "qwen3_5_moe_f32",
                      "quant_ct_gptq_actorder", "quant_ct_w4a16_asym", "quant_modelopt_nvfp4",
                      "quant_fp8_block", "quant_ct_w8a16", "quant_ct_gptq_actorder@int8",
                      "quant_ct_w4a16_asym@int8", "quant_modelopt_nvfp4@int8",
                      "quant_ct_w8a16@int8", "deepseek_v3_mtp_bf16", "deepseek_v3_noqlora_bf16",
                      "deepseek_v3_noqlora_bf16@bf16", "glm4_moe_qknorm_bf16"),
    [](const ::testing::TestParamInfo<std::string>& p) {
      std::string name = p.param;
      for (char& ch : name) ch = ch == '@' ? '_' : ch;
      return name;
    });

// The program of a dense model at 2 threads splits its linear layers and needs fewer barriers
// than the layer loop's dispatches.
TEST(Circuit, ProgramsSplitLinearsAndSaveBarriers) {
  auto m = load("qwen3_f32", 2, ExecutorKind::kCircuit);
  for (const auto& p : m->programs()) {
    const Program::Stats& s = p->stats();
    EXPECT_GT(s.partitioned, 0) << "width " << s.width;
    EXPECT_GT(s.serial, 0) << "width " << s.width;
    EXPECT_GT(s.split_ops, 0) << "width " << s.width;  // rope, norms, kv_store, attention
    EXPECT_LT(s.barriers, s.layer_dispatches) << "width " << s.width;
    EXPECT_GE(s.workspace_bytes, m->graph_plan().arena_bytes);
    EXPECT_NE(p->describe().find("linear"), std::string::npos);
  }
  // At 1 thread nothing waits for anything.
  auto one = load("qwen3_f32", 1, ExecutorKind::kCircuit);
  for (const auto& p : one->programs()) EXPECT_EQ(p->stats().barriers, 0);
}

// The default policy takes every fusion a dense model offers, and needs fewer barriers than
// policy none (which matches the layer loop op for op).
TEST(Circuit, DefaultFusionsCutBarriers) {
  auto none = load("qwen3_f32", 2, ExecutorKind::kCircuit);
  auto fused = load("qwen3_f32", 2, ExecutorKind::kCircuit, FusionPolicy::all());
  for (size_t i = 0; i < none->programs().size(); ++i) {
    const Program::Stats& n = none->programs()[i]->stats();
    const Program::Stats& f = fused->programs()[i]->stats();
    EXPECT_EQ(n.fused_residual + n.fused_gate_up + n.fused_norm, 0);
    EXPECT_GT(f.fused_residual, 0);
    EXPECT_GT(f.fused_gate_up, 0);
    EXPECT_GT(f.fused_norm, 0);
    EXPECT_LT(f.barriers, n.barriers) << "width " << f.width;
    EXPECT_LT(f.instructions, n.instructions);
    EXPECT_NE(fused->programs()[i]->describe().find("rms_norm+linear"), std::string::npos);
  }
}

// MoE experts, the delta rule and latent attention split themselves over the pool: at 2 threads
// the program runs them between two regions with every thread (kPooled), at 1 on thread 0.
TEST(Circuit, BigSelfSplittingOpsRunOverThePool) {
  for (const char* name : {"qwen3_moe_f32", "qwen3_next_f32", "deepseek_v3_noqlora_bf16"}) {
    auto two = load(name, 2, ExecutorKind::kCircuit);
    auto one = load(name, 1, ExecutorKind::kCircuit);
    ASSERT_FALSE(two->programs().empty()) << name;
    for (size_t i = 0; i < two->programs().size(); ++i) {
      const Program& p = *two->programs()[i];
      EXPECT_GT(p.stats().pooled, 0) << name << " width " << p.stats().width;
      EXPECT_NE(p.describe().find("pooled"), std::string::npos) << name;
      EXPECT_EQ(one->programs()[i]->stats().pooled, 0) << name;
      EXPECT_EQ(one->programs()[i]->stats().barriers, 0) << name;
    }
  }
  // A dense model has none.
  auto dense = load("qwen3_f32", 2, ExecutorKind::kCircuit);
  for (const auto& p : dense->programs()) EXPECT_EQ(p->stats().pooled, 0);
}

// `bench --profile` under the circuit: thread 0 brackets each instruction as the op the layer
// loop calls, so a program's step profiles the same ops, as often, as the layer loop's.
TEST(Circuit, ProfileCountsTheLayerLoopsOps) {
  for (const char* name : {"qwen3_f32", "qwen3_moe_f32"}) {
    std::map<std::string, uint64_t> calls[2];
    for (const int k : {0, 1}) {
      auto m = load(name, 2, k == 0 ? ExecutorKind::kLayers : ExecutorKind::kCircuit);
      const Reference ref(name);
      const auto V = static_cast<size_t>(m->vocab_size());
      std::vector<float> logits(V);
      Sequence s;
      m->prefill(s, ref.ids("input_ids"), logits);
      OpProfiler prof;
      m->backend().set_observer(&prof);
      std::vector<Sequence*> one{&s};
      m->decode(one, std::vector<int32_t>{1}, logits);
      m->backend().set_observer(nullptr);
      EXPECT_EQ(m->circuit_steps(), k == 0 ? 0 : 1) << name;
      for (const OpProfiler::Entry& e : prof.entries()) {
        calls[k][e.key] = e.calls;
        EXPECT_GE(e.seconds, 0.0) << e.key;
      }
      m->release(s);
    }
    // The layer loop's views (gather_rows of the one wanted row) are no op in the program.
    calls[0].erase("gather_rows");
    EXPECT_EQ(calls[1], calls[0]) << name;
  }
}

TEST(Circuit, UnknownExecutorIsAnError) {
  EXPECT_EQ(parse_executor("layers"), ExecutorKind::kLayers);
  EXPECT_EQ(parse_executor("circuit"), ExecutorKind::kCircuit);
  try {
    parse_executor("fused");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--executor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fused"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace metrale
