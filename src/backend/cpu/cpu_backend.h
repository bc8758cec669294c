#pragma once
// The CPU backend: Highway SIMD kernels with runtime dispatch (each kernel has a scalar
// twin in cpu/reference.h), work split over a ThreadPool; every output's arithmetic is fixed
// by the kernel, never by the split, so results do not depend on the thread count.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gated_delta.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/linear_job.h"

namespace metrale {

class ThreadPool;

class CpuBackend final : public Backend {
 public:
  // `pool` must outlive the backend; every op runs its work on it. Compute::kBF16 and kInt8
  // apply to bf16 weights prepared with kCopy (AVX-512 BF16, with twins computing the same bits
  // on AVX-512F, AVX2 and scalar CPUs); kInt8 also to int4 / int8 / nvfp4 weights (the q8
  // layouts of cpu/linear_quant.h: AVX-512 VNNI, with a portable twin).
  explicit CpuBackend(ThreadPool& pool, Compute compute = Compute::kF32);

  std::string_view name() const override { return "cpu"; }
  // 64-byte aligned; >= 2 MiB requests are 2 MiB aligned and advised MADV_HUGEPAGE.
  Buffer allocate(size_t bytes) override;
  Device device() const override { return Device::kHost; }
  bool supports(Op op, WeightFormat format, DType dtype) const override;

  ThreadPool& pool() const { return *pool_; }
  Compute compute() const { return compute_; }
  // delta_rule takes the chunked form for runs of more than this many rows that keep only
  // their last state (default: never; cpu/gated_delta.h says why).
  void set_delta_chunk_min_rows(int64_t rows) { delta_chunk_min_rows_ = rows; }

 protected:
  WeightTensor do_prepare(const WeightTensor& w, PrepareMode mode) override;
  void do_linear(ConstRows x, const WeightTensor& w, Rows y) override;
  void do_linears(std::span<const LinearCall> calls) override;
  void do_embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out) override;
  void do_rms_norm(const RmsNormArgs& a) override;
  void do_rope(const RopeArgs& a) override;
  void do_kv_store(const KvStoreArgs& a) override;
  void do_kv_move(const KvMoveArgs& a) override;
  void do_attention(const AttentionArgs& a) override;
  void do_gated_activation(const GatedActivationArgs& a) override;
  void do_route(const RouteArgs& a) override;
  void do_moe(const MoeArgs& a) override;
  void do_add(ConstRows x, Rows y) override;
  void do_causal_conv(const CausalConvArgs& a) override;
  void do_delta_rule(const DeltaRuleArgs& a) override;
  void do_sigmoid_mul(const SigmoidMulArgs& a) override;
  void do_latent_attention(const LatentAttentionArgs& a) override;
  void do_lora(const LoraArgs& a) override;
  void do_gather_rows(ConstRows x, std::span<const int32_t> rows, Rows out) override;
  void do_scatter_rows(ConstRows x, std::span<const int32_t> rows, Rows out, bool add) override;
  void do_rope_rows(const RopeRowsArgs& a) override;
  void do_layer_norm(const LayerNormArgs& a) override;
  void do_activation(const ActivationArgs& a) override;
  void do_varlen_attention(const VarlenAttentionArgs& a) override;
  void do_merge_rows(ConstRows x, Rows out) override;
  void do_tap_sum(const TapSumArgs& a) override;
  void do_segment_sum(ConstRows x, std::span<const int32_t> offsets, Rows out) override;
  void do_token_overlay(const TokenOverlayArgs& a) override;
  void do_head_overlay(const HeadOverlayArgs& a) override;
  void do_upload(void* dst, const void* host_src, size_t bytes) override;
  void do_download(void* host_dst, const void* src, size_t bytes) override;
  void do_copy(void* dst, const void* src, size_t bytes) override;
  void do_zero(void* dst, size_t bytes) override;
  bool knows_packing(const WeightTensor& w) const override;
  int64_t max_head_dim() const override { return cpu::kMaxHeadDim; }

 private:
  // Memory for one copied weight, carved from a shared chunk (see cpu_backend.cc).
  std::pair<std::shared_ptr<const Buffer>, char*> weight_memory(size_t bytes);

  ThreadPool* pool_;
  Compute compute_;
  // Scratch that grows to the largest call, then stays (no allocation in a warm step).
  std::shared_ptr<Buffer> weight_chunk_;
  size_t weight_chunk_used_ = 0;
  std::vector<uint16_t> x_bf16_;  // input rows rounded to bf16 (Compute::kBF16)
  std::vector<float> x_quant_;    // input rows as a quantized kernel reads them (any bytes)
  std::vector<cpu::AttentionRowSpan> attention_spans_;
  std::vector<float> varlen_keys_;  // varlen_attention: the keys transposed per head
  struct LinearPiece {              // do_linears: outputs [o_begin, o_end) of linear_jobs_[job]
    int32_t job;
    int64_t o_begin, o_end;
  };
  struct LinearInput {  // do_linears: where a call's input goes as its kernel reads it
    uint16_t* bf16 = nullptr;
    void* quant = nullptr;
  };
  std::vector<LinearInput> linear_inputs_;
  std::vector<cpu::LinearJob> linear_jobs_;
  std::vector<LinearPiece> linear_pieces_;
  struct MoeScratch {                         // cpu_moe.cc: the rows of one call grouped by expert
    std::vector<int32_t> count, start, fill;  // [n_experts]
    std::vector<int32_t> slot;                // [n * k] grouped row of each (row, choice)
    std::vector<int32_t> order;               // [n * k] choices of a row by ascending expert
    std::vector<float> x, h, y;               // grouped input, gate|up, output rows
    std::vector<uint16_t> x_bf16, h_bf16;     // bf16-rounded inputs of the pairs kernel
    std::vector<float> x_quant, h_quant;      // inputs as quantized experts' kernels read them
    std::vector<int32_t> expert_of;           // [n * k] expert of each grouped row
    std::vector<int32_t> lora_slot;           // [n * k] LoRA slot of each grouped row
    struct Item {
      int32_t job;
      int64_t o_begin, o_end;
    };
    std::vector<Item> items;
    std::vector<cpu::LinearJob> jobs;
  };
  MoeScratch moe_;
  std::vector<float> route_scratch_;  // cpu_moe.cc: a sigmoid router's choice and group scores
  // cpu_gated_delta.cc: each sequence's rows in a causal_conv / delta_rule call, and every
  // thread's scratch (thread t's share starts at t * its size, 64-byte aligned).
  int64_t state_spans(std::span<const int32_t> row_seq, const StateSlice& state);
  float* thread_scratch(size_t floats_per_thread);
  std::vector<cpu::StateSpan> state_spans_;
  std::vector<float> thread_scratch_;
  // lora.cc: rows grouped by slot, the (slot, rank) items of the shrink and its results.
  std::vector<int64_t> lora_group_starts_, lora_fill_;
  std::vector<const float*> lora_xs_;
  std::vector<float*> lora_ys_;
  std::vector<int32_t> lora_active_;
  std::vector<std::pair<int32_t, int32_t>> lora_items_;
  std::vector<float> lora_t_;
  int64_t delta_chunk_min_rows_ = cpu::kDeltaChunkMinRows;
};

}  // namespace metrale
