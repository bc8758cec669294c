// Quantized linear (int4, int8, fp8, nvfp4; cpu/linear_quant.h): every format and layout
// (symmetric / asymmetric, group 16 / 32 / 48 / 128 / per channel, a partial last group, g_idx
// by random assignment and by permutation, every scale dtype, a global scale) against the
// double-precision reference of dequantize_row, with the packed decode equal to dequantize_row
// bit for bit; then the determinism contract (a row alone == in a batch, GEMV == GEMM, any
// thread count, the portable kernel == the AVX-512 one), the MoE op on quantized experts, and a
// prepared weight that no longer needs its source.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear_quant.h"
#include "backend/cpu/reference.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

enum class Order { kNone, kRandom, kPermuted };  // g_idx: none, random groups, GPTQ act-order

struct Spec {
  WeightFormat format = WeightFormat::kInt4;
  bool asym = false;
  int64_t group = 0;  // 0: per channel (n_in)
  Order order = Order::kNone;
  DType scale_dtype = DType::kF32;
  float global = 1.0f;
};

std::string describe(const Spec& s, int64_t n_out, int64_t n_in) {
  std::ostringstream o;
  o << weight_format_name(s.format) << (s.asym ? " asym" : " sym") << " group=" << s.group
    << " g_idx=" << static_cast<int>(s.order) << " scales=" << dtype_name(s.scale_dtype)
    << " global=" << s.global << " out=" << n_out << " in=" << n_in;
  return o.str();
}

// The source buffers of a random quantized weight (what a loader hands prepare()).
struct Source {
  Spec spec;
  int64_t n_out = 0, n_in = 0, group = 0, n_groups = 0;
  std::vector<uint8_t> codes, scales;
  std::vector<int8_t> zeros;
  std::vector<int32_t> g_idx;
  std::vector<float> bias;

  WeightTensor tensor(bool with_bias) const {
    return WeightTensor{.name = "w",
                        .format = spec.format,
                        .n_out = n_out,
                        .n_in = n_in,
                        .data = codes.data(),
                        .quant = {.scales = scales.data(),
                                  .scale_dtype = spec.scale_dtype,
                                  .scale_global = spec.global,
                                  .group = group,
                                  .n_groups = n_groups,
                                  .zeros = zeros.empty() ? nullptr : zeros.data(),
                                  .g_idx = g_idx.empty() ? nullptr : g_idx.data()},
                        .bias = with_bias ? bias.data() : nullptr};
  }
};

Source make_source(const Spec& spec, int64_t n_out, int64_t n_in, uint32_t seed) {
  std::mt19937 rng(seed);
  Source s;
  s.spec = spec;
  s.n_out = n_out;
  s.n_in = n_in;
  s.group = spec.group > 0 ? spec.group : n_in;
  s.n_groups = quant_groups(n_in, s.group);
  s.codes.resize(weight_row_bytes(spec.format, n_in) * static_cast<size_t>(n_out));
  for (uint8_t& b : s.codes) {
    b = static_cast<uint8_t>(rng());
    if (spec.format == WeightFormat::kFp8 && (b & 0x7Fu) == 0x7Fu) b ^= 1;  // no NaN codes
  }
  const size_t n_scales = static_cast<size_t>(n_out * s.n_groups);
  std::uniform_real_distribution<float> mag(0.001f, 0.05f), e4m3_mag(0.02f, 440.0f);
  for (size_t i = 0; i < n_scales; ++i) {
    const float sign = rng() % 8 == 0 ? -1.0f : 1.0f;
    switch (spec.scale_dtype) {
      case DType::kF32: {
        const float v = sign * mag(rng);
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        s.scales.insert(s.scales.end(), p, p + 4);
        break;
      }
      case DType::kBF16:
      case DType::kF16: {
        const float v = sign * mag(rng);
        const uint16_t h = spec.scale_dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
        s.scales.push_back(static_cast<uint8_t>(h));
        s.scales.push_back(static_cast<uint8_t>(h >> 8));
        break;
      }
      default:
        s.scales.push_back(f32_to_f8e4m3(sign * e4m3_mag(rng)));
        break;
    }
  }
  if (spec.asym) {
    const int lo = spec.format == WeightFormat::kInt4 ? -8 : -128;
    const int hi = spec.format == WeightFormat::kInt4 ? 7 : 127;
    std::uniform_int_distribution<int> z(lo, hi);
    for (size_t i = 0; i < n_scales; ++i) s.zeros.push_back(static_cast<int8_t>(z(rng)));
  }
  if (spec.order == Order::kRandom) {
    std::uniform_int_distribution<int32_t> g(0, static_cast<int32_t>(s.n_groups - 1));
    for (int64_t k = 0; k < n_in; ++k) s.g_idx.push_back(g(rng));
  } else if (spec.order == Order::kPermuted) {
    std::vector<int32_t> perm(static_cast<size_t>(n_in));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t k = 0; k < n_in; ++k)
      s.g_idx.push_back(static_cast<int32_t>(perm[static_cast<size_t>(k)] / s.group));
  }
  s.bias = testing::random_vector(static_cast<size_t>(n_out), seed + 1);
  return s;
}

// The q8 input rows of x for w (q8 layout), by the portable quantizer.
std::vector<uint8_t> q8_input_portable(const WeightTensor& w, ConstRows x) {
  std::vector<uint8_t> out(static_cast<size_t>(x.n_rows * cpu::quant_input_bytes(w)));
  cpu::quantize_q8_rows_portable(cpu::quant_layout(w), x, 0, x.n_rows, out.data());
  return out;
}

// Runs the portable kernel on a prepared weight (preparing x as the backend does, with the
// portable quantizer for q8 layouts).
void run_portable(const WeightTensor& w, ConstRows x, Rows y) {
  const cpu::QuantLayout& l = cpu::quant_layout(w);
  std::vector<float> gathered;
  std::vector<uint8_t> q8;
  ConstRows xq = x;
  if (l.q8) {
    q8 = q8_input_portable(w, x);
  } else if (const int64_t bytes = cpu::quant_input_bytes(w); bytes != 0) {
    gathered.resize(static_cast<size_t>(x.n_rows * l.kp));
    cpu::prepare_quant_input(l, x, 0, x.n_rows, gathered.data());
    xq = ConstRows{gathered.data(), x.n_rows, l.kp, l.kp};
  }
  const cpu::QuantTask t{.x = xq,
                         .x8 = q8.empty() ? nullptr : q8.data(),
                         .w = &l,
                         .bias = static_cast<const float*>(w.bias),
                         .y = y};
  cpu::linear_quant_portable(t, 0, w.n_out);
}

// q8 layouts: what the kernel should compute, in double from the dequantized rows: per block
// of 32 packed positions, d * sum of q * w, with q and d as linear_quant.h defines them
// (recomputed here from x, not read from the quantizer); also the bound on its distance from
// the f32 result, sum of |w| * d / 2.
struct Q8Reference {
  std::vector<double> y, bound;
};
Q8Reference q8_reference(const cpu::QuantLayout& l, ConstRows x,
                         const std::vector<std::vector<float>>& rows, const float* bias) {
  const int32_t* perm = l.permutation();
  Q8Reference ref;
  for (int64_t r = 0; r < x.n_rows; ++r) {
    for (size_t o = 0; o < rows.size(); ++o) {
      double y = bias != nullptr ? bias[o] : 0.0, bound = 0.0;
      for (int64_t b = 0; b < l.kp / 32; ++b) {
        float v[32], w[32], amax = 0.0f;
        for (int64_t j = 0; j < 32; ++j) {
          const int64_t p = b * 32 + j;
          const int64_t col = perm != nullptr ? perm[p] : p;
          v[j] = col >= 0 ? x.row(r)[col] : 0.0f;
          w[j] = col >= 0 ? rows[o][static_cast<size_t>(col)] : 0.0f;
          amax = std::max(amax, std::abs(v[j]));
        }
        if (amax == 0.0f) continue;
        const float id = 127.0f / amax, d = amax / 127.0f;
        for (int64_t j = 0; j < 32; ++j) {
          y += static_cast<double>(d) * std::nearbyint(v[j] * id) * w[j];
          bound += std::abs(static_cast<double>(w[j])) * d / 2;
        }
      }
      ref.y.push_back(y);
      ref.bound.push_back(bound);
    }
  }
  return ref;
}

void expect_same_bits(const float* a, const float* b, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(testing::as_bits(a[i]), testing::as_bits(b[i])) << what << " at " << i;
}

// One weight through every check; x has 40 rows.
void check_spec(CpuBackend& be, const Spec& spec, int64_t n_out, int64_t n_in, bool with_bias,
                PrepareMode mode, uint32_t seed) {
  SCOPED_TRACE(describe(spec, n_out, n_in) + (with_bias ? " bias" : ""));
  const Source src = make_source(spec, n_out, n_in, seed);
  const WeightTensor raw = src.tensor(with_bias);
  const WeightTensor w = be.prepare(raw, mode);
  ASSERT_EQ(w.packing, cpu::kPackingQuant);
  const bool q8 = be.compute() == Compute::kInt8 && spec.format != WeightFormat::kFp8;
  ASSERT_EQ(cpu::quant_layout(w).q8, q8);
  // The layout this case is meant to cover (linear_quant.h): a gathered input for g_idx and
  // padded groups, two groups per block for group 16, raw e4m3 slots for NVFP4.
  const cpu::QuantLayout& layout = cpu::quant_layout(w);
  const int64_t group = spec.group > 0 ? spec.group : n_in;
  EXPECT_EQ(layout.perm != 0,
            spec.order != Order::kNone || n_in % 32 != 0 || (group % 32 != 0 && group != 16));
  EXPECT_EQ(cpu::quant_input_bytes(w) != 0, q8 || layout.perm != 0);
  if (spec.order != Order::kRandom) {
    EXPECT_EQ(layout.per_half, group <= 16);
  }
  EXPECT_EQ(layout.e4m3_slots, spec.scale_dtype == DType::kF8E4M3);

  // The packed decode is dequantize_row, bit for bit.
  std::vector<float> want(static_cast<size_t>(n_in)), got(static_cast<size_t>(n_in));
  const size_t row_bytes = weight_row_bytes(spec.format, n_in);
  std::vector<std::vector<float>> rows;
  for (int64_t o = 0; o < n_out; ++o) {
    dequantize_row(spec.format, src.codes.data() + static_cast<size_t>(o) * row_bytes, raw.quant, o,
                   n_in, want.data());
    cpu::unpack_quant_row(cpu::quant_layout(w), o, got.data());
    expect_same_bits(want.data(), got.data(), n_in, "decode");
    rows.push_back(want);
  }

  constexpr int64_t kRows = 40;
  const auto x = testing::random_vector(static_cast<size_t>(kRows * n_in), seed + 2, -2.0f, 2.0f);
  const ConstRows xr = rows_of(x.data(), kRows, n_in);
  std::vector<float> ref(static_cast<size_t>(kRows * n_out));
  cpu::reference::linear(xr, spec.format, src.codes.data(), raw.quant, n_out, n_in,
                         static_cast<const float*>(raw.bias), rows_of(ref.data(), kRows, n_out));
  std::vector<float> all(ref.size(), NAN);
  be.linear(xr, w, rows_of(all.data(), kRows, n_out));
  if (q8) {
    // The quantized input: the SIMD quantizer's bytes are the portable one's.
    std::vector<uint8_t> simd(static_cast<size_t>(kRows * cpu::quant_input_bytes(w)));
    cpu::prepare_quant_input(layout, xr, 0, kRows, simd.data());
    const std::vector<uint8_t> portable = q8_input_portable(w, xr);
    for (int64_t r = 0; r < kRows; ++r) {
      // Compare codes and blocks only (the row's tail up to 64 bytes is not written).
      const size_t at = static_cast<size_t>(r * cpu::quant_input_bytes(w));
      const size_t used = static_cast<size_t>(layout.kp + layout.kp / 32 * 16);
      ASSERT_TRUE(std::equal(simd.begin() + at, simd.begin() + at + used, portable.begin() + at))
          << "q8 input row " << r;
    }
    // The integer dot per block, then d and the scales: close to its double-precision value,
    // and within the activations' rounding of the f32 result.
    const Q8Reference q = q8_reference(layout, xr, rows, with_bias ? src.bias.data() : nullptr);
    for (size_t i = 0; i < all.size(); ++i) {
      double s = with_bias ? std::abs(src.bias[i % static_cast<size_t>(n_out)]) : 0.0;
      s += q.bound[i] * 254.0;  // >= sum of |d q w|
      ASSERT_NEAR(all[i], q.y[i], 1e-6 + s * 4e-7 * std::sqrt(static_cast<double>(n_in) + 1.0))
          << "q8 vs its double reference at " << i;
      ASSERT_NEAR(all[i], ref[i], q.bound[i] * 1.001 + 1e-5 + s * 1e-6)
          << "q8 vs f32 beyond the activations' rounding at " << i;
    }
  }
  for (int64_t r = 0; !q8 && r < kRows; ++r) {
    for (int64_t o = 0; o < n_out; ++o) {
      double s = with_bias ? std::abs(src.bias[static_cast<size_t>(o)]) : 0.0;
      for (int64_t k = 0; k < n_in; ++k)
        s += std::abs(static_cast<double>(xr.row(r)[k]) *
                      rows[static_cast<size_t>(o)][static_cast<size_t>(k)]);
      const double bound = 1e-6 + s * 4e-7 * std::sqrt(static_cast<double>(n_in) + 1.0);
      const size_t i = static_cast<size_t>(r * n_out + o);
      ASSERT_NEAR(all[i], ref[i], bound) << "row " << r << " out " << o;
    }
  }
  // GEMV (1-4 rows) and smaller GEMM batches, and rows alone at an offset: the same bits.
  for (int64_t n : {1, 2, 3, 4, 5, 17}) {
    std::vector<float> part(static_cast<size_t>(n * n_out), NAN);
    be.linear(rows_of(x.data(), n, n_in), w, rows_of(part.data(), n, n_out));
    expect_same_bits(part.data(), all.data(), n * n_out, "batch prefix");
  }
  for (int64_t r : {7, 38}) {
    std::vector<float> alone(static_cast<size_t>(n_out), NAN);
    be.linear(rows_of(x.data() + r * n_in, 1, n_in), w, rows_of(alone.data(), 1, n_out));
    expect_same_bits(alone.data(), all.data() + r * n_out, n_out, "row alone");
  }
  // The portable kernel (non-AVX-512 CPUs, METRALE_CPU_PACK=0): the same bits.
  std::vector<float> portable(all.size(), NAN);
  run_portable(w, xr, rows_of(portable.data(), kRows, n_out));
  expect_same_bits(portable.data(), all.data(), kRows * n_out, "portable");
  std::vector<float> portable1(static_cast<size_t>(n_out), NAN);
  run_portable(w, rows_of(x.data(), 1, n_in), rows_of(portable1.data(), 1, n_out));
  expect_same_bits(portable1.data(), all.data(), n_out, "portable, one row");
}

std::vector<DType> scale_dtypes(WeightFormat f) {
  if (f == WeightFormat::kNvfp4) return {DType::kF8E4M3, DType::kF32};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

struct Layout {
  int64_t group;
  Order order;
  int64_t n_in;
};

// Every test runs under Compute::kF32 (f32 layouts) and Compute::kInt8 (q8 layouts for int4,
// int8 and nvfp4; fp8 stays f32).
class QuantLinear : public ::testing::TestWithParam<Compute> {};

TEST_P(QuantLinear, MatchesReferenceInEveryFormatAndLayout) {
  ThreadPool pool(2);
  CpuBackend be(pool, GetParam());
  // n_in 320: group 128 leaves a partial last group of 64, group 48 is no multiple of 32 (groups
  // padded), group 16 puts two groups in a block; n_in 80 pads per channel and at group 16
  // leaves a block's second half empty.
  const std::vector<Layout> layouts = {
      {16, Order::kNone, 320},   {32, Order::kNone, 320},     {128, Order::kNone, 320},
      {0, Order::kNone, 320},    {48, Order::kNone, 320},     {128, Order::kRandom, 320},
      {32, Order::kRandom, 320}, {16, Order::kPermuted, 320}, {128, Order::kPermuted, 320},
      {0, Order::kNone, 80},     {16, Order::kNone, 80},
  };
  struct Variant {
    WeightFormat format;
    bool asym;
  };
  const Variant variants[] = {{WeightFormat::kInt4, false}, {WeightFormat::kInt4, true},
                              {WeightFormat::kInt8, false}, {WeightFormat::kInt8, true},
                              {WeightFormat::kFp8, false},  {WeightFormat::kNvfp4, false}};
  const int64_t outs[] = {1, 15, 16, 33, 64};
  uint32_t seed = 100;
  int i = 0;
  for (const Variant& v : variants) {
    for (const Layout& l : layouts) {
      for (DType sd : scale_dtypes(v.format)) {
        ++i;
        Spec spec{.format = v.format,
                  .asym = v.asym,
                  .group = l.group,
                  .order = l.order,
                  .scale_dtype = sd};
        // A global scale other than 1 every other case (NVFP4's is small, the e4m3 scales big).
        if (i % 2 == 0) spec.global = sd == DType::kF8E4M3 ? 1.0f / 2688.0f : 0.37f;
        check_spec(be, spec, outs[i % 5], l.n_in, i % 3 != 0,
                   i % 4 == 0 ? PrepareMode::kInPlace : PrepareMode::kCopy, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(QuantLinear, ResultIndependentOfThreadCount) {
  // 13 tiles over 1, 2 and 3 threads, GEMV and GEMM.
  ThreadPool pool1(1), pool2(2), pool3(3);
  CpuBackend one(pool1, GetParam()), two(pool2, GetParam()), three(pool3, GetParam());
  const int64_t n_out = 200, n_in = 256;
  for (const Spec& spec :
       {Spec{.format = WeightFormat::kInt4, .asym = true, .group = 128},
        Spec{.format = WeightFormat::kNvfp4,
        .group = 16,
        .scale_dtype = DType::kF8E4M3,
        .global = 0.01f},
        Spec{.format = WeightFormat::kInt8, .group = 64, .order = Order::kRandom},
        Spec{.format = WeightFormat::kFp8}}) {
    SCOPED_TRACE(describe(spec, n_out, n_in));
    const Source src = make_source(spec, n_out, n_in, 5);
    const WeightTensor w = one.prepare(src.tensor(true), PrepareMode::kCopy);
    for (int64_t rows : {1, 3, 70}) {
      const auto x = testing::random_vector(static_cast<size_t>(rows * n_in), 6);
      std::vector<float> y1(static_cast<size_t>(rows * n_out)), y2(y1.size()), y3(y1.size());
      one.linear(rows_of(x.data(), rows, n_in), w, rows_of(y1.data(), rows, n_out));
      two.linear(rows_of(x.data(), rows, n_in), w, rows_of(y2.data(), rows, n_out));
      three.linear(rows_of(x.data(), rows, n_in), w, rows_of(y3.data(), rows, n_out));
      expect_same_bits(y1.data(), y2.data(), rows * n_out, "1 vs 2 threads");
      expect_same_bits(y1.data(), y3.data(), rows * n_out, "1 vs 3 threads");
    }
  }
}

TEST_P(QuantLinear, PreparedWeightOutlivesItsSource) {
  ThreadPool pool(2);
  CpuBackend be(pool, GetParam());
  const int64_t n_out = 40, n_in = 192, rows = 6;
  const auto x = testing::random_vector(static_cast<size_t>(rows * n_in), 3);
  for (PrepareMode mode : {PrepareMode::kInPlace, PrepareMode::kCopy}) {
    auto src = std::make_unique<Source>(make_source(
        {.format = WeightFormat::kInt4, .asym = true, .group = 64, .order = Order::kRandom}, n_out,
        n_in, 9));
    std::vector<uint16_t> bias_bf16(static_cast<size_t>(n_out));
    for (size_t i = 0; i < bias_bf16.size(); ++i) bias_bf16[i] = f32_to_bf16(src->bias[i]);
    WeightTensor raw = src->tensor(false);
    raw.bias = bias_bf16.data();
    raw.bias_dtype = DType::kBF16;
    std::vector<float> before(static_cast<size_t>(rows * n_out)), after(before.size());
    const WeightTensor w = be.prepare(raw, mode);
    be.linear(rows_of(x.data(), rows, n_in), w, rows_of(before.data(), rows, n_out));
    EXPECT_EQ(w.quant.scales, nullptr);
    EXPECT_EQ(w.quant.g_idx, nullptr);
    EXPECT_EQ(w.bias_dtype, DType::kF32);
    // Overwrite, then free, everything the source owned.
    std::fill(src->codes.begin(), src->codes.end(), 0x5A);
    std::fill(src->scales.begin(), src->scales.end(), 0xFF);
    std::fill(src->zeros.begin(), src->zeros.end(), 3);
    std::fill(src->g_idx.begin(), src->g_idx.end(), 0);
    std::fill(bias_bf16.begin(), bias_bf16.end(), 0x7FC0);
    src.reset();
    bias_bf16 = {};
    be.linear(rows_of(x.data(), rows, n_in), w, rows_of(after.data(), rows, n_out));
    expect_same_bits(before.data(), after.data(), rows * n_out, "after the source is gone");
  }
}

TEST(QuantLinearBackend, SupportsAndRejects) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  for (WeightFormat f :
       {WeightFormat::kInt4, WeightFormat::kInt8, WeightFormat::kFp8, WeightFormat::kNvfp4}) {
    EXPECT_TRUE(be.supports(Op::kLinear, f, DType::kF32)) << weight_format_name(f);
    EXPECT_TRUE(be.supports(Op::kMoe, f, DType::kF32)) << weight_format_name(f);
    EXPECT_FALSE(be.supports(Op::kEmbedding, f, DType::kF32)) << weight_format_name(f);
  }
  // A quantized weight runs only as prepare() packs it.
  const Source src = make_source({.format = WeightFormat::kInt8, .group = 32}, 4, 64, 1);
  const auto x = testing::random_vector(64, 2);
  std::vector<float> y(4);
  EXPECT_THROW(be.linear(rows_of(x.data(), 1, 64), src.tensor(false), rows_of(y.data(), 1, 4)),
               Error);
  // fp8 NaN codes have no place in the decode: rejected at prepare, naming the weight.
  Source nan = make_source({.format = WeightFormat::kFp8}, 4, 64, 1);
  nan.codes[70] = 0xFF;
  try {
    be.prepare(nan.tensor(false), PrepareMode::kCopy);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("NaN"), std::string::npos) << e.message();
  }
}

// MoE with quantized experts of mixed formats (some reading a gathered input: g_idx, or the
// down projection's 40 inputs padded to 64): equal to the per-row loop through linear, bit for
// bit, whatever the company and the thread count.
constexpr int64_t kH = 96, kI = 40, kE = 8, kK = 3;

TEST_P(QuantLinear, MoeOnQuantizedExpertsEqualsPerRowLinear) {
  ThreadPool pool3(3), pool1(1);
  CpuBackend be(pool3, GetParam()), one(pool1, GetParam());
  const Spec specs[] = {
      {.format = WeightFormat::kInt4, .asym = true, .group = 32},
      {.format = WeightFormat::kInt4, .group = 32, .order = Order::kRandom},
      {.format = WeightFormat::kNvfp4, .group = 16, .scale_dtype = DType::kF8E4M3, .global = 0.01f},
      {.format = WeightFormat::kInt8, .asym = true},
      {.format = WeightFormat::kFp8, .scale_dtype = DType::kBF16},
  };
  std::vector<Source> sources;
  std::vector<MoeExpertWeights> experts;
  for (int64_t e = 0; e < kE; ++e) {
    const Spec& spec = specs[e % 5];
    sources.push_back(make_source(spec, 2 * kI, kH, static_cast<uint32_t>(10 + 2 * e)));
    sources.push_back(make_source(spec, kH, kI, static_cast<uint32_t>(11 + 2 * e)));
    experts.push_back({be.prepare(sources[sources.size() - 2].tensor(false), PrepareMode::kCopy),
                       be.prepare(sources.back().tensor(false), PrepareMode::kCopy)});
  }
  const int64_t n = 29;
  const auto x = testing::random_vector(static_cast<size_t>(n * kH), 7, -2.0f, 2.0f);
  const auto weights = testing::random_vector(static_cast<size_t>(n * kK), 8, 0.05f, 1.0f);
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < kK; ++j)
      ids.push_back(static_cast<int32_t>((r * 3 + j * (1 + r % 2)) % kE));
  }
  auto run_moe = [&](CpuBackend& b, int64_t r0, int64_t rows) {
    std::vector<float> out(static_cast<size_t>(rows * kH), NAN);
    b.moe({.x = rows_of(x.data() + r0 * kH, rows, kH),
           .experts =
               std::span(ids).subspan(static_cast<size_t>(r0 * kK), static_cast<size_t>(rows * kK)),
           .weights = std::span(weights).subspan(static_cast<size_t>(r0 * kK),
                                                 static_cast<size_t>(rows * kK)),
           .top_k = kK,
           .expert_weights = experts,
           .out = rows_of(out.data(), rows, kH)});
    return out;
  };
  const std::vector<float> all = run_moe(be, 0, n);
  // The per-row loop: each chosen expert in ascending id through linear and gated_activation.
  std::vector<float> want(static_cast<size_t>(n * kH), 0.0f), gu(2 * kI), y(kH);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> order(kK);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return ids[static_cast<size_t>(r * kK + a)] < ids[static_cast<size_t>(r * kK + b)];
    });
    for (int64_t j : order) {
      const MoeExpertWeights& ew =
          experts[static_cast<size_t>(ids[static_cast<size_t>(r * kK + j)])];
      one.linear(rows_of(x.data() + r * kH, 1, kH), ew.gate_up, rows_of(gu.data(), 1, 2 * kI));
      const Rows g = rows_of(gu.data(), 1, kI);
      one.gated_activation({.gate = g, .up = rows_of(gu.data() + kI, 1, kI), .out = g});
      one.linear(g, ew.down, rows_of(y.data(), 1, kH));
      for (int64_t d = 0; d < kH; ++d)
        want[static_cast<size_t>(r * kH + d)] +=
            y[static_cast<size_t>(d)] * weights[static_cast<size_t>(r * kK + j)];
    }
  }
  expect_same_bits(all.data(), want.data(), n * kH, "moe vs per-row linear");
  for (int64_t r = 0; r < n; r += 4) {
    const std::vector<float> alone = run_moe(one, r, 1);
    expect_same_bits(alone.data(), all.data() + r * kH, kH, "row alone");
  }
}

INSTANTIATE_TEST_SUITE_P(Compute, QuantLinear, ::testing::Values(Compute::kF32, Compute::kInt8),
                         [](const ::testing::TestParamInfo<Compute>& p) {
                           return p.param == Compute::kF32 ? "f32" : "int8";
                         });

}  // namespace
}  // namespace metrale
