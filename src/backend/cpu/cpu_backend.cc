// CpuBackend: memory, capabilities, prepare(), and the weight ops (linear, embedding). The
// activation-only ops live in cpu_ops.cc, the MoE ops in cpu_moe.cc. The public Backend op
// validated the arguments (backend.cc); these split the work over the pool.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <ostream>

#include "backend/cpu/kernels.h"
#include "backend/cpu/linear_packed.h"
#include "backend/cpu/linear_pairs.h"
#include "backend/cpu/linear_quant.h"
#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

constexpr size_t kSmallAlign = 64;

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Pieces per thread when output units are claimed dynamically.
constexpr int64_t kPiecesPerThread = 8;

// Calls kernel(o_begin, o_end) over output rows [0, n_out) in pieces of whole units (a
// multiple of `unit_multiple` units) that the threads claim as they go
// (ThreadPool::parallel_for_dynamic). Safe for linear kernels: each output's sum is fixed
// by the kernel, never by which thread computes it or with which neighbours. A thread the
// machine slows (another process, a descheduled vCPU) then takes fewer pieces: +7% at decode
// batch 1 on 2 threads beside a busy process, no change on a quiet machine.
template <typename Kernel>
void for_output_pieces(ThreadPool& pool, int64_t n_out, int64_t unit_multiple, Kernel&& kernel) {
  const int64_t units = (n_out + cpu::kLinearUnit - 1) / cpu::kLinearUnit;
  int64_t grain = std::max<int64_t>(1, units / (pool.size() * kPiecesPerThread));
  grain = (grain + unit_multiple - 1) / unit_multiple * unit_multiple;
  pool.parallel_for_dynamic(static_cast<size_t>(units), static_cast<size_t>(grain),
                            [&](size_t b, size_t e, int) {
                              kernel(static_cast<int64_t>(b) * cpu::kLinearUnit,
                                     std::min(n_out, static_cast<int64_t>(e) * cpu::kLinearUnit));
                            });
}

// Rows from which a linear is bound by arithmetic rather than by reading its weights: its
// pieces are then claimed in decreasing sizes (for_output_pieces_guided).
constexpr int64_t kGuidedRows = 32;

// Like for_output_pieces, for calls of many rows: a piece is 1 / (8 x threads) of the units
// not yet claimed (whole multiples of `unit_multiple`, at least one), so the pieces start at
// for_output_pieces' size (never larger: a thread the machine preempts strands no more work
// than before) and shrink to one multiple as the work runs out, and the threads finish within
// about one of them of each other, where equal pieces left a thread idle for half a piece on
// average at the end of every linear (~1/30 of a prefill linear on 2 threads). Early pieces
// are runs of consecutive weight tiles (the pairs kernel prefetches the next one). Claimed
// with a compare-exchange, so no piece list is kept.
template <typename Kernel>
void for_output_pieces_guided(ThreadPool& pool, int64_t n_out, int64_t unit_multiple,
                              Kernel&& kernel) {
  const int64_t units = (n_out + cpu::kLinearUnit - 1) / cpu::kLinearUnit;
  const int64_t split = kPiecesPerThread * static_cast<int64_t>(pool.size());
  std::atomic<int64_t> next{0};
  pool.parallel_for(static_cast<size_t>(pool.size()), [&](size_t, size_t, int) {
    int64_t b = next.load(std::memory_order_relaxed);
    while (b < units) {
      int64_t n = std::max<int64_t>(1, (units - b) / split);
      n = (n + unit_multiple - 1) / unit_multiple * unit_multiple;
      if (!next.compare_exchange_weak(b, b + n, std::memory_order_relaxed)) continue;
      kernel(b * cpu::kLinearUnit, std::min(n_out, (b + n) * cpu::kLinearUnit));
      b = next.load(std::memory_order_relaxed);
    }
  });
}

// Calls fn(r_begin, r_end) over input rows [0, n_rows) writing `values` values in all: on this
// thread for small passes (a parallel pass would cost a barrier more than it saves), else split
// over the pool.
template <typename Fn>
void input_pass(ThreadPool& pool, int64_t n_rows, size_t values, Fn&& fn) {
  constexpr size_t kParallelValues = size_t{1} << 16;
  if (values < kParallelValues) {
    fn(0, n_rows);
  } else {
    pool.parallel_for(static_cast<size_t>(n_rows), [&](size_t b, size_t e, int) {
      fn(static_cast<int64_t>(b), static_cast<int64_t>(e));
    });
  }
}

// w's bias (f32 or bf16) as f32 into dst (n_out floats); returns dst.
const float* copy_bias(const WeightTensor& w, float* dst) {
  if (w.bias_dtype == DType::kF32) {
    std::memcpy(dst, w.bias, static_cast<size_t>(w.n_out) * sizeof(float));
  } else {
    cpu::widen_bf16(static_cast<const uint16_t*>(w.bias), w.n_out, dst);
  }
  return dst;
}

}  // namespace

CpuBackend::CpuBackend(ThreadPool& pool, Compute compute) : pool_(&pool), compute_(compute) {}

Buffer CpuBackend::allocate(size_t bytes) {
  // Zeroed; 64-byte aligned, or from 2 MiB up a 2 MiB-aligned mapping advised for huge pages
  // (core/aligned_buffer.h). At least one byte, so even an empty request gets real memory
  // (the free function needs the size only for mappings, which a one-byte block is not).
  const AlignedBuffer::Released memory = AlignedBuffer(std::max<size_t>(bytes, 1)).release();
  return Buffer(memory.data, bytes, memory.free_fn);
}

bool CpuBackend::supports(Op op, WeightFormat format, DType dtype) const {
  if (dtype != DType::kF32) return false;
  // Linear and MoE take every WeightFormat (quantized ones through cpu/linear_quant.h); an
  // embedding table is plain rows.
  if (op == Op::kEmbedding) return format == WeightFormat::kF32 || format == WeightFormat::kBF16;
  return true;
}

bool CpuBackend::knows_packing(const WeightTensor& w) const {
  // Quantized weights run only as prepare() packs them (there is no kernel for their
  // checkpoint rows).
  if (is_quantized(w.format)) return w.packing == cpu::kPackingQuant;
  return w.packing == 0 ||
         ((w.packing == cpu::kPackingBf16x16 || w.packing == cpu::kPackingBf16Pairs) &&
          w.format == WeightFormat::kBF16);
}

std::pair<std::shared_ptr<const Buffer>, char*> CpuBackend::weight_memory(size_t bytes) {
  // Copied weights go back to back into shared huge-page chunks: a mapping per tensor would
  // round each up to whole 2 MiB pages (a Qwen3-30B-A3B expert's 6.3 MB gate|up would take
  // 8 MB). A chunk lives while any tensor in it does (WeightTensor::storage shares it).
  constexpr size_t kChunk = size_t{64} << 20;
  bytes = round_up(std::max<size_t>(bytes, 1), kSmallAlign);
  if (bytes > kChunk / 4) {
    auto own = std::make_shared<Buffer>(allocate(bytes));
    return {own, own->as<char>()};
  }
  if (!weight_chunk_ || weight_chunk_used_ + bytes > weight_chunk_->size()) {
    weight_chunk_ = std::make_shared<Buffer>(allocate(kChunk));
    weight_chunk_used_ = 0;
  }
  char* at = weight_chunk_->as<char>() + weight_chunk_used_;
  weight_chunk_used_ += bytes;
  return {weight_chunk_, at};
}

WeightTensor CpuBackend::do_prepare(const WeightTensor& w, PrepareMode mode) {
  WeightTensor out = w;
  if (is_quantized(w.format)) {
    // Always repacked (either mode): codes, scales, zero points and the input order folded
    // into one buffer the kernels stream (cpu/linear_quant.h); nothing refers to w's memory.
    // Compute::kInt8 packs the q8 layout where the format has one (cpu/linear_quant.h).
    const bool q8 = compute_ == Compute::kInt8 && mode != PrepareMode::kCopyF32Input &&
                    cpu::q8_packable(w.format);
    const size_t data_bytes = cpu::quant_packed_bytes(w, q8);
    const size_t bias_offset = round_up(data_bytes, kSmallAlign);
    const size_t bias_bytes = w.bias != nullptr ? static_cast<size_t>(w.n_out) * sizeof(float) : 0;
    auto [buffer, base] = weight_memory(bias_offset + bias_bytes);
    cpu::pack_quant(w, base, q8);
    out.data = base;
    out.packing = cpu::kPackingQuant;
    out.quant = QuantParams{};
    if (w.bias != nullptr) {
      out.bias = copy_bias(w, reinterpret_cast<float*>(base + bias_offset));
      out.bias_dtype = DType::kF32;
    }
    out.storage = std::move(buffer);
    return out;
  }
  const bool convert_bias = w.bias != nullptr && w.bias_dtype != DType::kF32;
  if (mode == PrepareMode::kInPlace && !convert_bias) return out;

  // A copy is the chance to repack bf16 rows for the AVX-512 kernels (in place, the caller's
  // rows stay as they are and the Highway kernel reads them): the pair layout for bf16
  // compute, else the 16-row tiles of the f32-activation kernel.
  // kCopyF32Input keeps the f32-activation kernel whatever the compute.
  const bool copy = mode != PrepareMode::kInPlace;
  const bool copy_bf16 = copy && w.format == WeightFormat::kBF16;
  const bool pairs = copy_bf16 && mode == PrepareMode::kCopy && compute_ != Compute::kF32 &&
                     cpu::pairs_packable(w.n_in);
  const bool pack = copy_bf16 && !pairs && cpu::packable_bf16(w.n_in) && cpu::packed_bf16_enabled();
  const size_t data_bytes = !copy   ? 0
                            : pairs ? cpu::pairs_bf16_bytes(w.n_out, w.n_in)
                            : pack
                                ? cpu::packed_bf16_bytes(w.n_out, w.n_in)
                                : weight_row_bytes(w.format, w.n_in) * static_cast<size_t>(w.n_out);
  const size_t bias_offset = round_up(data_bytes, kSmallAlign);
  const size_t bias_bytes = w.bias != nullptr ? static_cast<size_t>(w.n_out) * sizeof(float) : 0;
  auto [buffer, base] = weight_memory(bias_offset + bias_bytes);
  if (pairs) {
    cpu::pack_pairs_bf16(static_cast<const uint16_t*>(w.data), w.n_out, w.n_in,
                         reinterpret_cast<uint16_t*>(base));
    out.data = base;
    out.packing = cpu::kPackingBf16Pairs;
  } else if (pack) {
    cpu::pack_bf16(static_cast<const uint16_t*>(w.data), w.n_out, w.n_in,
                   reinterpret_cast<uint16_t*>(base));
    out.data = base;
    out.packing = cpu::kPackingBf16x16;
  } else if (copy) {
    std::memcpy(base, w.data, data_bytes);
    out.data = base;
  }
  if (w.bias != nullptr) {
    out.bias = copy_bias(w, reinterpret_cast<float*>(base + bias_offset));
    out.bias_dtype = DType::kF32;
  }
  out.storage = std::move(buffer);
  return out;
}

namespace cpu {

void LinearJob::run(int64_t o_begin, int64_t o_end) const {
  switch (kind) {
    case Kind::kF32:
      return linear_f32(task, o_begin, o_end);
    case Kind::kBf16:
      return linear_bf16(task, o_begin, o_end);
    case Kind::kBf16Packed:
      return linear_bf16_packed(task, o_begin, o_end);
    case Kind::kBf16Pairs:
      return linear_bf16_pairs(pairs, o_begin, o_end);
    case Kind::kQuant:
      return linear_quant(quant, o_begin, o_end);
  }
}

LinearJob make_linear_job(ConstRows x, const uint16_t* x_bf16, const WeightTensor& w, Rows y,
                          const void* x_quant) {
  LinearJob j;
  j.n_out = w.n_out;
  const auto* bias = static_cast<const float*>(w.bias);
  if (w.packing == kPackingQuant) {
    const QuantLayout& l = quant_layout(w);
    j.kind = LinearJob::Kind::kQuant;
    ConstRows xk = x;
    if (!l.q8 && l.perm != 0)
      xk = ConstRows{static_cast<const float*>(x_quant), x.n_rows, l.kp, l.kp};
    j.quant = QuantTask{.x = xk,
                        .x8 = l.q8 ? static_cast<const uint8_t*>(x_quant) : nullptr,
                        .w = &l,
                        .bias = bias,
                        .y = y};
    return j;
  }
  if (w.packing == kPackingBf16Pairs) {
    j.kind = LinearJob::Kind::kBf16Pairs;
    j.pairs = PairsTask{.x = x_bf16,
                        .n_rows = x.n_rows,
                        .w = static_cast<const uint16_t*>(w.data),
                        .n_in = w.n_in,
                        .n_out = w.n_out,
                        .bias = bias,
                        .y = y};
    return j;
  }
  j.task = LinearTask{.x = x, .w = w.data, .n_in = w.n_in, .bias = bias, .y = y};
  if (w.format == WeightFormat::kF32) {
    j.kind = LinearJob::Kind::kF32;
  } else {
    j.kind = w.packing == kPackingBf16x16 ? LinearJob::Kind::kBf16Packed : LinearJob::Kind::kBf16;
  }
  return j;
}

}  // namespace cpu

void CpuBackend::do_linear(ConstRows x, const WeightTensor& w, Rows y) {
  const uint16_t* x_bf16 = nullptr;
  if (cpu::reads_bf16_input(w)) {
    const size_t need = static_cast<size_t>(x.n_rows * x.n_cols);
    if (x_bf16_.size() < need) x_bf16_.resize(need);
    // Rounding once per call (not per weight tile) keeps the tiles on bf16 pairs only.
    input_pass(*pool_, x.n_rows, need,
               [&](int64_t b, int64_t e) { cpu::round_rows_bf16(x, b, e, x_bf16_.data()); });
    x_bf16 = x_bf16_.data();
  }
  const void* x_quant = nullptr;
  if (const int64_t bytes = cpu::quant_input_bytes(w); bytes != 0) {
    // The input as the quantized kernel reads it (in packed order; int8 for q8 layouts), once
    // per call.
    const size_t need = static_cast<size_t>(x.n_rows * bytes) / sizeof(float);
    if (x_quant_.size() < need) x_quant_.resize(need);
    input_pass(*pool_, x.n_rows, need, [&](int64_t b, int64_t e) {
      cpu::prepare_quant_input(cpu::quant_layout(w), x, b, e, x_quant_.data());
    });
    x_quant = x_quant_.data();
  }
  const cpu::LinearJob job = cpu::make_linear_job(x, x_bf16, w, y, x_quant);
  auto run = [&](int64_t o_begin, int64_t o_end) { job.run(o_begin, o_end); };
  if (x.n_rows >= kGuidedRows) {
    for_output_pieces_guided(*pool_, w.n_out, job.unit_multiple(), run);
  } else {
    for_output_pieces(*pool_, w.n_out, job.unit_multiple(), run);
  }
}

void CpuBackend::do_linears(std::span<const LinearCall> calls) {
  // Each call's input as its kernel reads it (bf16 rows, quantized rows), back to back.
  size_t bf16_values = 0, quant_bytes = 0;
  for (const LinearCall& c : calls) {
    if (cpu::reads_bf16_input(*c.w)) bf16_values += static_cast<size_t>(c.x.n_rows * c.x.n_cols);
    quant_bytes += static_cast<size_t>(c.x.n_rows * cpu::quant_input_bytes(*c.w));
  }
  if (x_bf16_.size() < bf16_values) x_bf16_.resize(bf16_values);
  if (x_quant_.size() * sizeof(float) < quant_bytes)
    x_quant_.resize(quant_bytes / sizeof(float) + 1);
  linear_inputs_.clear();
  size_t bf16_at = 0, quant_at = 0;
  int64_t units = 0;
  for (const LinearCall& c : calls) {
    LinearInput in;
    if (cpu::reads_bf16_input(*c.w)) {
      in.bf16 = x_bf16_.data() + bf16_at;
      bf16_at += static_cast<size_t>(c.x.n_rows * c.x.n_cols);
    }
    if (const int64_t bytes = cpu::quant_input_bytes(*c.w); bytes != 0) {
      in.quant = reinterpret_cast<char*>(x_quant_.data()) + quant_at;
      quant_at += static_cast<size_t>(c.x.n_rows * bytes);
    }
    linear_inputs_.push_back(in);
    if (c.x.n_rows > 0) units += (c.w->n_out + cpu::kLinearUnit - 1) / cpu::kLinearUnit;
  }
  input_pass(*pool_, static_cast<int64_t>(calls.size()), bf16_values + quant_bytes,
             [&](int64_t b, int64_t e) {
               for (auto i = static_cast<size_t>(b); i < static_cast<size_t>(e); ++i) {
                 const LinearCall& c = calls[i];
                 const LinearInput& in = linear_inputs_[i];
                 if (in.bf16 != nullptr) cpu::round_rows_bf16(c.x, 0, c.x.n_rows, in.bf16);
                 if (in.quant != nullptr)
                   cpu::prepare_quant_input(cpu::quant_layout(*c.w), c.x, 0, c.x.n_rows, in.quant);
               }
             });
  linear_jobs_.clear();
  for (size_t i = 0; i < calls.size(); ++i) {
    const LinearInput& in = linear_inputs_[i];
    linear_jobs_.push_back(
        cpu::make_linear_job(calls[i].x, in.bf16, *calls[i].w, calls[i].y, in.quant));
  }
  // One dispatch over the output pieces of every call, as the MoE op runs its experts.
  linear_pieces_.clear();
  const int64_t grain0 = std::max<int64_t>(1, units / (pool_->size() * kPiecesPerThread));
  for (size_t j = 0; j < linear_jobs_.size(); ++j) {
    const cpu::LinearJob& job = linear_jobs_[j];
    if (calls[j].x.n_rows == 0) continue;
    const int64_t m = job.unit_multiple();
    const int64_t grain = (grain0 + m - 1) / m * m * cpu::kLinearUnit;
    for (int64_t o = 0; o < job.n_out; o += grain)
      linear_pieces_.push_back({static_cast<int32_t>(j), o, std::min(job.n_out, o + grain)});
  }
  pool_->parallel_for_dynamic(linear_pieces_.size(), 1, [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i) {
      const LinearPiece& p = linear_pieces_[i];
      linear_jobs_[static_cast<size_t>(p.job)].run(p.o_begin, p.o_end);
    }
  });
}

void CpuBackend::do_embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out) {
  const size_t row_bytes = weight_row_bytes(table.format, table.n_in);
  const auto* base = static_cast<const char*>(table.data);
  pool_->parallel_for(ids.size(), [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i) {
      const char* src = base + static_cast<size_t>(ids[i]) * row_bytes;
      float* dst = out.row(static_cast<int64_t>(i));
      if (table.packing == cpu::kPackingBf16Pairs) {
        cpu::unpack_pairs_row(static_cast<const uint16_t*>(table.data), table.n_in, ids[i], dst);
      } else if (table.packing == cpu::kPackingBf16x16) {
        cpu::unpack_bf16_row(static_cast<const uint16_t*>(table.data), table.n_in, ids[i], dst);
      } else if (table.format == WeightFormat::kF32) {
        std::memcpy(dst, src, row_bytes);
      } else {
        cpu::widen_bf16(reinterpret_cast<const uint16_t*>(src), table.n_in, dst);
      }
    }
  });
}

}  // namespace metrale
