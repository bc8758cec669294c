// A decode step allocates nothing on the heap once the model is loaded and warmed up: the
// forward of every layer, attention, the lm_head and the thread pool's dispatch run on
// memory planned at load time. (A sequence's own token list and block table grow by
// amortised push_back; the test reserves them, so what it measures is the step itself.)
// This executable's operator new counts every allocation, on any thread.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include <string>
#include <tuple>
#include "engine/model.h"
#include "fixture_util.h"

namespace {
std::atomic<long> g_allocations{0};

void* counted(std::size_t n, std::size_t align) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t)
                ? std::aligned_alloc(align, (n + align - 1) / align * align)
                : std::malloc(n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new[](std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return counted(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept {
  return operator new(n, a, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace metrale {
namespace {

// (fixture, compute): a dense model and an MoE one, whose expert grouping must not allocate
// either, whichever experts a step happens to choose.
class DecodeAllocations : public ::testing::TestWithParam<std::tuple<std::string, Compute>> {};

TEST_P(DecodeAllocations, StepsAllocateNothing) {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 256;
  o.max_rows = 8;
  o.compute = std::get<1>(GetParam());
  auto m = Model::load(testing::fixture_dir(std::get<0>(GetParam())), o);
  constexpr size_t kSeqs = 3;
  constexpr int kSteps = 6;
  const auto V = static_cast<size_t>(m->vocab_size());
  std::vector<Sequence> seqs(kSeqs);
  std::vector<Sequence*> ptrs;
  std::vector<float> logits(kSeqs * V);
  for (size_t i = 0; i < kSeqs; ++i) {
    seqs[i].tokens.reserve(64);
    seqs[i].block_table.reserve(8);
    const std::vector<int32_t> prompt = {1, static_cast<int32_t>(2 + i), 3};
    m->prefill(seqs[i], prompt, std::span(logits).first(V));
    ptrs.push_back(&seqs[i]);
  }
  std::vector<int32_t> tokens(kSeqs, 5);
  for (size_t width : {kSeqs, size_t{1}}) {  // batched steps, then one sequence alone
    const auto batch = std::span(ptrs).first(width);
    m->decode(batch, std::span(tokens).first(width),
              std::span(logits).first(width * V));  // warm-up
    const long before = g_allocations.load();
    for (int s = 0; s < kSteps; ++s) {
      for (size_t i = 0; i < width; ++i)
        tokens[i] = static_cast<int32_t>(7 + 31 * s + 5 * i);  // other experts
      m->decode(batch, std::span(tokens).first(width), std::span(logits).first(width * V));
    }
    EXPECT_EQ(g_allocations.load() - before, 0)
        << "decode steps at batch " << width << " allocated";
  }
  // The counter does see allocations (the test is not vacuous).
  const long before = g_allocations.load();
  std::vector<int>* probe = new std::vector<int>(100);
  delete probe;
  EXPECT_GE(g_allocations.load() - before, 2);
  for (Sequence& s : seqs) m->release(s);
}

// The circuit's programs (circuit/program.h) allocate nothing per step either: their pointers,
// partitions and scratch are resolved at load (widths 2 and 1 run a program each), with and
// without fusions (the norm fusion's per-thread rows too).
TEST(DecodeAllocations, CircuitStepsAllocateNothing) {
  for (const auto& [fixture, compute, fusion] :
       {std::tuple<std::string, Compute, FusionPolicy>{"qwen3_bf16", Compute::kF32, {}},
        {"qwen3_bf16", Compute::kBF16, {}},
        {"qwen3_bf16", Compute::kBF16, FusionPolicy::all()},
        {"qwen3_moe_bf16", Compute::kF32, {}},
        {"qwen3_next_bf16", Compute::kF32, FusionPolicy::all()},
        {"deepseek_v3_mtp_bf16", Compute::kF32, {}},
        {"quant_ct_gptq_actorder", Compute::kInt8, FusionPolicy::all()}}) {
    LoadOptions o;
    o.n_threads = 2;
    o.kv_tokens = 256;
    o.max_rows = 8;
    o.compute = compute;
    o.executor = ExecutorKind::kCircuit;
    o.fusion = fusion;
    auto m = Model::load(testing::fixture_dir(fixture), o);
    const auto V = static_cast<size_t>(m->vocab_size());
    std::vector<Sequence> seqs(2);
    std::vector<Sequence*> ptrs;
    std::vector<float> logits(2 * V);
    for (size_t i = 0; i < 2; ++i) {
      seqs[i].tokens.reserve(64);
      seqs[i].block_table.reserve(8);
      const std::vector<int32_t> prompt = {1, static_cast<int32_t>(2 + i), 3};
      m->prefill(seqs[i], prompt, std::span(logits).first(V));
      ptrs.push_back(&seqs[i]);
    }
    std::vector<int32_t> tokens(2, 5);
    for (size_t width : {size_t{2}, size_t{1}}) {
      const auto batch = std::span(ptrs).first(width);
      m->decode(batch, std::span(tokens).first(width), std::span(logits).first(width * V));
      const long before = g_allocations.load();
      const int64_t ran = m->circuit_steps();
      for (int s = 0; s < 6; ++s) {
        for (size_t i = 0; i < width; ++i) tokens[i] = static_cast<int32_t>(7 + 31 * s + 5 * i);
        m->decode(batch, std::span(tokens).first(width), std::span(logits).first(width * V));
      }
      EXPECT_EQ(g_allocations.load() - before, 0)
          << fixture << ": circuit decode steps at batch " << width << " allocated";
      EXPECT_EQ(m->circuit_steps() - ran, 6) << fixture << ": the program did not run";
    }
    for (Sequence& q : seqs) m->release(q);
  }
}

// Rows of different LoRA adapters and the base model in one step, on a bf16 base (and an MoE
// one with adapted experts): the LoRA op groups rows in scratch planned by the first step.
TEST(DecodeAllocations, LoraStepsAllocateNothing) {
  for (const auto& [fixture, lora, adapters] :
       {std::tuple<std::string, std::string, std::vector<std::string>>{
            "qwen3_bf16", "lora/qwen3_dense", {"a", "c", ""}},
        {"qwen3_moe_bf16", "lora/qwen3_moe_experts", {"e1", "", "e2"}}}) {
    LoadOptions o;
    o.n_threads = 2;
    o.kv_tokens = 256;
    o.max_rows = 8;
    auto m = Model::load(testing::fixture_dir(fixture), o);
    LoraPool& pool = m->enable_lora({.max_loras = 2, .max_rank = 16, .dtype = DType::kBF16});
    for (const std::string& a : adapters)
      if (!a.empty()) pool.load(a, testing::fixture_dir(lora + "/" + a));
    const size_t n = adapters.size();
    const auto V = static_cast<size_t>(m->vocab_size());
    std::vector<Sequence> seqs(n);
    std::vector<Sequence*> ptrs;
    std::vector<float> logits(n * V);
    for (size_t i = 0; i < n; ++i) {
      seqs[i].tokens.reserve(64);
      seqs[i].block_table.reserve(8);
      m->set_adapter(seqs[i], adapters[i]);
      const std::vector<int32_t> prompt = {1, static_cast<int32_t>(2 + i), 3};
      m->prefill(seqs[i], prompt, std::span(logits).first(V));
      ptrs.push_back(&seqs[i]);
    }
    std::vector<int32_t> tokens(n, 5);
    m->decode(ptrs, tokens, logits);  // warm-up
    const long before = g_allocations.load();
    for (int s = 0; s < 6; ++s) {
      for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(7 + 31 * s + 5 * i);
      m->decode(ptrs, tokens, logits);
    }
    EXPECT_EQ(g_allocations.load() - before, 0) << fixture << ": LoRA decode steps allocated";
    for (Sequence& q : seqs) m->release(q);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, DecodeAllocations,
    ::testing::Combine(::testing::Values("qwen3_bf16", "qwen3_moe_bf16", "qwen3_next_bf16",
                                         "qwen3_5_moe_f32", "quant_ct_gptq_actorder",
                                         "deepseek_v3_mtp_bf16", "glm4_moe_qknorm_bf16",
                                         "deepseek_v3_fp8", "quant_modelopt_nvfp4"),
                       ::testing::Values(Compute::kF32, Compute::kBF16, Compute::kInt8)),
    [](const auto& p) {
      const Compute c = std::get<1>(p.param);
      return std::get<0>(p.param) + (c == Compute::kF32    ? "_f32"
                                     : c == Compute::kBF16 ? "_bf16"
                                                           : "_int8");
    });

}  // namespace
}  // namespace metrale
