#pragma once
// The CPU backend: Highway SIMD kernels with runtime dispatch (each kernel has a scalar
// twin in cpu/reference.h), work split over a ThreadPool with a static, deterministic split.
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace metrale {

class ThreadPool;

class CpuBackend final : public Backend {
 public:
  // `pool` must outlive the backend; every op runs its work on it. Compute::kBF16 applies to
  // bf16 weights prepared with kCopy (fast with AVX-512 BF16, a scalar loop without AVX-512).
  explicit CpuBackend(ThreadPool& pool, Compute compute = Compute::kF32);

  std::string_view name() const override { return "cpu"; }
  // 64-byte aligned; >= 2 MiB requests are 2 MiB aligned and advised MADV_HUGEPAGE.
  Buffer allocate(size_t bytes) override;
  bool supports(Op op, WeightFormat format, DType dtype) const override;
  WeightTensor prepare(const WeightTensor& w, PrepareMode mode) override;

  void linear(ConstRows x, const WeightTensor& w, Rows y) override;
  void embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out) override;
  void rms_norm(const RmsNormArgs& a) override;
  void rope(const RopeArgs& a) override;
  void kv_store(const KvStoreArgs& a) override;
  void attention_decode(const DecodeAttentionArgs& a) override;
  void attention_prefill(const PrefillAttentionArgs& a) override;
  void gated_activation(const GatedActivationArgs& a) override;
  void argmax(ConstRows logits, std::span<int32_t> out) override;

  ThreadPool& pool() const { return *pool_; }
  Compute compute() const { return compute_; }

 private:
  void linear_pairs(ConstRows x, const WeightTensor& w, Rows y);

  ThreadPool* pool_;
  Compute compute_;
  // Input rows rounded to bf16 for Compute::kBF16; grows to the largest call, then stays.
  std::vector<uint16_t> x_bf16_;
};

}  // namespace metrale
