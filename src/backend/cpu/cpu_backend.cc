// CpuBackend: memory, capabilities, prepare(), and the weight ops (linear, embedding,
// argmax). The activation-only ops live in cpu_ops.cc. Each op validates its arguments
// once per call, then splits the work over the pool; kernels are in kernels.h.
#include "backend/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <ostream>

#include "backend/cpu/kernels.h"
#include "backend/cpu/linear_packed.h"
#include "backend/cpu/linear_pairs.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

constexpr size_t kSmallAlign = 64;
constexpr size_t kHugePage = size_t{2} << 20;

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

void free_small(void* p, size_t /*bytes*/) { std::free(p); }
void free_huge(void* p, size_t bytes) { munmap(p, round_up(bytes, kHugePage)); }

// Output rows per unit of the linear work split: small enough to spread a decode GEMV over
// all threads, large enough to keep the 4-row weight tiles whole.
constexpr int64_t kLinearUnit = 16;
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
  const int64_t units = (n_out + kLinearUnit - 1) / kLinearUnit;
  int64_t grain = std::max<int64_t>(1, units / (pool.size() * kPiecesPerThread));
  grain = (grain + unit_multiple - 1) / unit_multiple * unit_multiple;
  pool.parallel_for_dynamic(static_cast<size_t>(units), static_cast<size_t>(grain), [&](size_t b, size_t e, int) {
    kernel(static_cast<int64_t>(b) * kLinearUnit, std::min(n_out, static_cast<int64_t>(e) * kLinearUnit));
  });
}

// The operand `role` of `op` (on weight `name`, when not empty) is [n_rows, n_cols]. The
// message is assembled only on failure: these checks run on every op of a decode step,
// which must not allocate.
struct Operand {
  std::string_view op, name, role;
};
std::ostream& operator<<(std::ostream& os, const Operand& o) {
  os << o.op;
  if (!o.name.empty()) os << " '" << o.name << "'";
  return os << " " << o.role;
}

void check_rows(const Operand& what, ConstRows r, int64_t n_rows, int64_t n_cols) {
  METRALE_CHECK(r.data != nullptr || r.n_rows == 0, what, ": null data");
  METRALE_CHECK(r.n_rows == n_rows && r.n_cols == n_cols, what, ": expected [", n_rows, ", ",
                n_cols, "], found [", r.n_rows, ", ", r.n_cols, "]");
  METRALE_CHECK(r.stride >= r.n_cols, what, ": stride ", r.stride, " is smaller than its ", r.n_cols,
                " columns");
}

}  // namespace

CpuBackend::CpuBackend(ThreadPool& pool, Compute compute) : pool_(&pool), compute_(compute) {}

Buffer CpuBackend::allocate(size_t bytes) {
  if (bytes >= kHugePage) {
    // Anonymous memory comes zeroed; over-map by one huge page to align the start to 2 MiB
    // so transparent huge pages can back the whole buffer, then trim the slack.
    const size_t size = round_up(bytes, kHugePage);
    void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    METRALE_CHECK(raw != MAP_FAILED, "cpu backend: cannot map ", size, " bytes");
    auto* base = static_cast<char*>(raw);
    auto* aligned = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(base), kHugePage));
    const size_t head = static_cast<size_t>(aligned - base);
    if (head > 0) munmap(base, head);
    const size_t tail = kHugePage - head;
    if (tail > 0) munmap(aligned + size, tail);
    madvise(aligned, size, MADV_HUGEPAGE);  // advice only: failure is harmless
    return Buffer(aligned, bytes, &free_huge);
  }
  const size_t size = round_up(std::max<size_t>(bytes, 1), kSmallAlign);
  void* p = std::aligned_alloc(kSmallAlign, size);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, size);
  return Buffer(p, bytes, &free_small);
}

bool CpuBackend::supports(Op op, WeightFormat format, DType dtype) const {
  if (dtype != DType::kF32) return false;
  switch (op) {
    case Op::kLinear:
    case Op::kEmbedding:
      return format == WeightFormat::kF32 || format == WeightFormat::kBF16;
    default:
      return true;
  }
}

WeightTensor CpuBackend::prepare(const WeightTensor& w, PrepareMode mode) {
  METRALE_CHECK(w.n_out > 0 && w.n_in > 0, "weight '", w.name, "': shape [", w.n_out, ", ", w.n_in,
                "] must be non-empty");
  METRALE_CHECK(w.data != nullptr, "weight '", w.name, "': no data");
  METRALE_CHECK(w.packing == 0, "weight '", w.name, "': already prepared (packing ", w.packing, ")");
  require(Op::kLinear, w.format, DType::kF32, w.name);
  METRALE_CHECK(w.bias == nullptr || w.bias_dtype == DType::kF32 || w.bias_dtype == DType::kBF16,
                "weight '", w.name, "': bias must be f32 or bf16, found ", dtype_name(w.bias_dtype));

  WeightTensor out = w;
  const bool convert_bias = w.bias != nullptr && w.bias_dtype != DType::kF32;
  if (mode == PrepareMode::kInPlace && !convert_bias) return out;

  // A copy is the chance to repack bf16 rows for the AVX-512 kernels (in place, the caller's
  // rows stay as they are and the Highway kernel reads them): the pair layout for bf16
  // compute, else the 16-row tiles of the f32-activation kernel.
  const bool copy_bf16 = mode == PrepareMode::kCopy && w.format == WeightFormat::kBF16;
  const bool pairs = copy_bf16 && compute_ == Compute::kBF16 && cpu::pairs_packable(w.n_in);
  const bool pack = copy_bf16 && !pairs && cpu::packable_bf16(w.n_in) && cpu::packed_bf16_enabled();
  const size_t data_bytes =
      mode != PrepareMode::kCopy ? 0
      : pairs                    ? cpu::pairs_bf16_bytes(w.n_out, w.n_in)
      : pack                     ? cpu::packed_bf16_bytes(w.n_out, w.n_in)
                                 : weight_row_bytes(w.format, w.n_in) * static_cast<size_t>(w.n_out);
  const size_t bias_offset = round_up(data_bytes, kSmallAlign);
  const size_t bias_bytes = w.bias != nullptr ? static_cast<size_t>(w.n_out) * sizeof(float) : 0;
  auto buffer = std::make_shared<Buffer>(allocate(bias_offset + bias_bytes));
  auto* base = buffer->as<char>();
  if (pairs) {
    cpu::pack_pairs_bf16(static_cast<const uint16_t*>(w.data), w.n_out, w.n_in, reinterpret_cast<uint16_t*>(base));
    out.data = base;
    out.packing = cpu::kPackingBf16Pairs;
  } else if (pack) {
    cpu::pack_bf16(static_cast<const uint16_t*>(w.data), w.n_out, w.n_in, reinterpret_cast<uint16_t*>(base));
    out.data = base;
    out.packing = cpu::kPackingBf16x16;
  } else if (mode == PrepareMode::kCopy) {
    std::memcpy(base, w.data, data_bytes);
    out.data = base;
  }
  if (w.bias != nullptr) {
    auto* bias = reinterpret_cast<float*>(base + bias_offset);
    if (w.bias_dtype == DType::kF32) {
      std::memcpy(bias, w.bias, bias_bytes);
    } else {
      cpu::widen_bf16(static_cast<const uint16_t*>(w.bias), w.n_out, bias);
    }
    out.bias = bias;
    out.bias_dtype = DType::kF32;
  }
  out.storage = std::move(buffer);
  return out;
}

void CpuBackend::linear(ConstRows x, const WeightTensor& w, Rows y) {
  METRALE_CHECK(w.data != nullptr, "linear '", w.name, "': weight has no data");
  METRALE_CHECK(w.packing == 0 || ((w.packing == cpu::kPackingBf16x16 || w.packing == cpu::kPackingBf16Pairs) &&
                                    w.format == WeightFormat::kBF16),
                "linear '", w.name, "': unknown packing ", w.packing);
  METRALE_CHECK(w.bias == nullptr || w.bias_dtype == DType::kF32, "linear '", w.name,
                "': bias is ", dtype_name(w.bias_dtype), "; pass the weight through prepare() first");
  check_rows({"linear", w.name, "input"}, x, x.n_rows, w.n_in);
  check_rows({"linear", w.name, "output"}, y, x.n_rows, w.n_out);
  if (x.n_rows == 0) return;
  if (w.packing == cpu::kPackingBf16Pairs) return linear_pairs(x, w, y);
  const cpu::LinearTask task{.x = x, .w = w.data, .n_in = w.n_in, .bias = static_cast<const float*>(w.bias), .y = y};
  void (*kernel)(const cpu::LinearTask&, int64_t, int64_t) = nullptr;
  switch (w.format) {
    case WeightFormat::kF32: kernel = &cpu::linear_f32; break;
    case WeightFormat::kBF16:
      kernel = w.packing == cpu::kPackingBf16x16 ? &cpu::linear_bf16_packed : &cpu::linear_bf16;
      break;
  }
  METRALE_CHECK(kernel != nullptr, "linear '", w.name, "': weight format ", weight_format_name(w.format),
                " is not supported by the cpu backend");
  for_output_pieces(*pool_, w.n_out, 1, [&](int64_t o_begin, int64_t o_end) { kernel(task, o_begin, o_end); });
}

void CpuBackend::linear_pairs(ConstRows x, const WeightTensor& w, Rows y) {
  const size_t need = static_cast<size_t>(x.n_rows * x.n_cols);
  if (x_bf16_.size() < need) x_bf16_.resize(need);
  // Rounding once per call (not per weight tile) keeps the tiles on bf16 pairs only. Small
  // batches round on this thread: a parallel pass would cost a barrier more than it saves.
  constexpr size_t kParallelRound = size_t{1} << 16;
  if (need < kParallelRound) {
    cpu::round_rows_bf16(x, 0, x.n_rows, x_bf16_.data());
  } else {
    pool_->parallel_for(static_cast<size_t>(x.n_rows), [&](size_t b, size_t e, int) {
      cpu::round_rows_bf16(x, static_cast<int64_t>(b), static_cast<int64_t>(e), x_bf16_.data());
    });
  }
  const cpu::PairsTask task{.x = x_bf16_.data(),
                            .n_rows = x.n_rows,
                            .w = static_cast<const uint16_t*>(w.data),
                            .n_in = w.n_in,
                            .n_out = w.n_out,
                            .bias = static_cast<const float*>(w.bias),
                            .y = y};
  for_output_pieces(*pool_, w.n_out, cpu::kPairsTileGroups,
                    [&](int64_t o_begin, int64_t o_end) { cpu::linear_bf16_pairs(task, o_begin, o_end); });
}

void CpuBackend::embedding(const WeightTensor& table, std::span<const int32_t> ids, Rows out) {
  METRALE_CHECK(table.data != nullptr, "embedding '", table.name, "': table has no data");
  METRALE_CHECK(table.format == WeightFormat::kF32 || table.format == WeightFormat::kBF16, "embedding '",
                table.name, "': format ", weight_format_name(table.format), " is not supported by the cpu backend");
  check_rows({"embedding", table.name, "output"}, out, static_cast<int64_t>(ids.size()), table.n_in);
  for (size_t i = 0; i < ids.size(); ++i) {
    METRALE_CHECK(ids[i] >= 0 && ids[i] < table.n_out, "embedding '", table.name, "': token id ", ids[i],
                  " at index ", i, " is outside the vocabulary [0, ", table.n_out, ")");
  }
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

void CpuBackend::argmax(ConstRows logits, std::span<int32_t> out) {
  check_rows({"argmax", "", "logits"}, logits, static_cast<int64_t>(out.size()), logits.n_cols);
  METRALE_CHECK(logits.n_cols > 0, "argmax: logits have no columns");
  for (int64_t r = 0; r < logits.n_rows; ++r) {
    const float* x = logits.row(r);
    int64_t best = 0;
    for (int64_t i = 1; i < logits.n_cols; ++i) {
      if (x[i] > x[best]) best = i;
    }
    out[static_cast<size_t>(r)] = static_cast<int32_t>(best);
  }
}

}  // namespace metrale
