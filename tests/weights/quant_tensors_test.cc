// read_quantized: each producer's on-disk layout, built here byte by byte from the layout's
// definition (tests/data/fixtures/README.md), normalises to values equal to the producer's
// dequantization formula; and every malformed module is refused naming the tensor.
// (The real producers' files are checked end to end in tests/engine/model_parity_test.cc.)
#include "weights/quant_tensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors/writer.h"
#include "support/test_support.h"

namespace metrale {
namespace {

using test::error_of;

constexpr const char* kP = "model.layers.0.mlp.up_proj";

template <class T>
std::span<const std::byte> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

// A module under construction: tensors to write and the dense values they must decode to.
struct Module {
  int64_t n = 0, k = 0;
  std::vector<float> want;  // [n, k]
  SafetensorsWriter w;

  template <class T>
  void add(const std::string& leaf, DType d, Shape s, const std::vector<T>& v) {
    w.add(std::string(kP) + "." + leaf, d, s, as_bytes(v));
  }
};

// Writes the module and reads it back with `scheme` (default: let the tensors decide).
QuantizedWeight read_back(Module& m, const test::ScratchDir& dir, ModuleScheme scheme = {}) {
  if (scheme.rule.empty()) {
    scheme.kind = ModuleScheme::Kind::kAny;
    scheme.rule = "test";
  }
  m.w.write(dir / "model.safetensors");
  const Checkpoint c = Checkpoint::open(dir.path());
  return read_quantized(c, kP, scheme, m.n, m.k);
}

void expect_decodes_to(const QuantizedWeight& q, const std::vector<float>& want, float rel = 0) {
  const size_t row_bytes = weight_row_bytes(q.format, q.n_in);
  std::vector<float> row(static_cast<size_t>(q.n_in));
  for (int64_t n = 0; n < q.n_out; ++n) {
    dequantize_row(q.format, q.codes.data() + n * row_bytes, q.params(), n, q.n_in, row.data());
    for (int64_t k = 0; k < q.n_in; ++k) {
      const float w = want[static_cast<size_t>(n * q.n_in + k)];
      ASSERT_NEAR(row[static_cast<size_t>(k)], w, rel * std::abs(w))
          << q.describe() << " row " << n << " col " << k;
    }
  }
}

// compressed-tensors pack-quantized: int32 words, LSB first, stored q + 2^(bits-1); zero
// points packed the same way along the outputs.
Module pack_quantized(int bits, int64_t n, int64_t k, int64_t group, bool asym, bool g_idx,
                      uint32_t seed) {
  std::mt19937 rng(seed);
  const int lo = -(1 << (bits - 1)), hi = (1 << (bits - 1)) - 1;
  std::uniform_int_distribution<int> qd(lo, hi);
  std::uniform_real_distribution<float> sd(0.01f, 0.2f);
  const int64_t groups = (k + group - 1) / group;
  Module m;
  m.n = n;
  m.k = k;
  std::vector<int32_t> gi(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) gi[c] = g_idx ? static_cast<int32_t>(rng() % groups) : c / group;
  std::vector<uint16_t> scale(static_cast<size_t>(n * groups));
  for (auto& s : scale) s = f32_to_bf16(sd(rng));
  std::vector<int> zero(static_cast<size_t>(n * groups), 0);
  if (asym)
    for (auto& z : zero) z = qd(rng);
  const int per = 32 / bits;
  const int64_t words = (k + per - 1) / per;
  std::vector<uint32_t> packed(static_cast<size_t>(n * words), 0);
  m.want.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int q = qd(rng);
      packed[r * words + c / per] |= static_cast<uint32_t>((q - lo) & ((1 << bits) - 1))
                                     << (bits * (c % per));
      const int64_t g = gi[c];
      m.want[r * k + c] =
          static_cast<float>(q - zero[r * groups + g]) * bf16_to_f32(scale[r * groups + g]);
    }
  }
  m.add("weight_packed", DType::kI32, Shape{n, words}, packed);
  m.add("weight_scale", DType::kBF16, Shape{n, groups}, scale);
  m.add("weight_shape", DType::kI64, Shape{2}, std::vector<int64_t>{n, k});
  if (asym) {
    const int64_t zrows = (n + per - 1) / per;
    std::vector<uint32_t> zp(static_cast<size_t>(zrows * groups), 0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < groups; ++g)
        zp[(r / per) * groups + g] |=
            static_cast<uint32_t>((zero[r * groups + g] - lo) & ((1 << bits) - 1))
            << (bits * (r % per));
    m.add("weight_zero_point", DType::kI32, Shape{zrows, groups}, zp);
  }
  if (g_idx) m.add("weight_g_idx", DType::kI32, Shape{k}, gi);
  return m;
}

TEST(QuantTensors, PackQuantizedInt4GroupSymmetric) {
  test::ScratchDir dir;
  Module m = pack_quantized(4, 24, 256, 128, false, false, 1);
  const QuantizedWeight q = read_back(m, dir);
  EXPECT_EQ(q.format, WeightFormat::kInt4);
  EXPECT_EQ(q.group, 128);
  EXPECT_TRUE(q.zeros.empty());
  expect_decodes_to(q, m.want);
}

TEST(QuantTensors, PackQuantizedInt4AsymmetricActorder) {
  test::ScratchDir dir;
  Module m = pack_quantized(4, 21, 96, 32, true, true, 2);  // 21 rows: a partial zero word
  const QuantizedWeight q = read_back(m, dir);
  EXPECT_FALSE(q.zeros.empty());
  EXPECT_EQ(q.g_idx.size(), 96u);
  expect_decodes_to(q, m.want);
}

TEST(QuantTensors, PackQuantizedInt8ChannelAndGroup) {
  {
    test::ScratchDir dir;
    Module m = pack_quantized(8, 10, 64, 64, false, false, 3);
    const QuantizedWeight q = read_back(m, dir);
    EXPECT_EQ(q.format, WeightFormat::kInt8);
    EXPECT_EQ(q.n_groups, 1);
    expect_decodes_to(q, m.want);
  }
  {
    test::ScratchDir dir;
    Module m = pack_quantized(8, 9, 64, 16, true, false, 4);
    expect_decodes_to(read_back(m, dir), m.want);
  }
}

// e2m1 codes with e4m3 scales per 16 values; `modelopt` chooses the dialect's names and the
// meaning of its global scale.
Module nvfp4(bool modelopt, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> sd(0.05f, 3.0f);
  Module m;
  m.n = n;
  m.k = k;
  std::vector<uint8_t> codes(static_cast<size_t>(n * k / 2));
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  std::vector<uint8_t> scale(static_cast<size_t>(n * k / 16));
  for (auto& s : scale) s = f32_to_f8e4m3(sd(rng));
  const float global = modelopt ? 0.0123f : 81.25f;
  m.want.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t nib = static_cast<uint8_t>(codes[(r * k + c) / 2] >> (4 * (c % 2)));
      const float s = f8e4m3_to_f32(scale[r * (k / 16) + c / 16]);
      m.want[r * k + c] = modelopt ? e2m1_to_f32(nib) * s * global : e2m1_to_f32(nib) * s / global;
    }
  }
  m.add(modelopt ? "weight" : "weight_packed", DType::kU8, Shape{n, k / 2}, codes);
  m.add("weight_scale", DType::kF8E4M3, Shape{n, k / 16}, scale);
  m.add(modelopt ? "weight_scale_2" : "weight_global_scale", DType::kF32,
        modelopt ? Shape{} : Shape{1}, std::vector<float>{global});
  m.add("input_scale", DType::kF32, Shape{}, std::vector<float>{0.5f});
  return m;
}

TEST(QuantTensors, Nvfp4BothDialects) {
  for (const bool modelopt : {false, true}) {
    test::ScratchDir dir;
    Module m = nvfp4(modelopt, 12, 64, 5);
    const QuantizedWeight q = read_back(m, dir);
    EXPECT_EQ(q.format, WeightFormat::kNvfp4);
    EXPECT_EQ(q.scale_dtype, DType::kF8E4M3);
    expect_decodes_to(q, m.want, 1e-6f);  // the global is folded into the scale first
  }
}

// float8 codes (never NaN) with a scale tensor of `scale_shape`; value = e4m3 * scale(n, k).
Module fp8(int64_t n, int64_t k, Shape scale_shape, const std::string& scale_name,
           const std::function<float(int64_t, int64_t, const std::vector<float>&)>& scale_of,
           uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> sd(0.001f, 0.01f);
  Module m;
  m.n = n;
  m.k = k;
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (auto& c : codes) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c = 0x3C;
  }
  std::vector<float> scales(static_cast<size_t>(scale_shape.numel()));
  for (auto& s : scales) s = sd(rng);
  m.want.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      m.want[r * k + c] = f8e4m3_to_f32(codes[r * k + c]) * scale_of(r, c, scales);
  m.add("weight", DType::kF8E4M3, Shape{n, k}, codes);
  m.add(scale_name, DType::kF32, scale_shape, scales);
  return m;
}

TEST(QuantTensors, Fp8TensorChannelAndPartialBlocks) {
  {
    test::ScratchDir dir;
    Module m = fp8(
        7, 48, Shape{}, "weight_scale", [](auto, auto, auto& s) { return s[0]; }, 6);
    m.add("input_scale", DType::kF32, Shape{}, std::vector<float>{0.5f});
    const QuantizedWeight q = read_back(m, dir);
    EXPECT_EQ(q.format, WeightFormat::kFp8);
    expect_decodes_to(q, m.want);
  }
  {
    test::ScratchDir dir;
    Module m = fp8(
        7, 48, Shape{7, 1}, "weight_scale", [](auto r, auto, auto& s) { return s[r]; }, 7);
    expect_decodes_to(read_back(m, dir), m.want);
  }
  {
    // 200 x 320 in 128 x 128 blocks: partial blocks along both edges.
    test::ScratchDir dir;
    Module m = fp8(
        200, 320, Shape{2, 3}, "weight_scale_inv",
        [](auto r, auto c, auto& s) { return s[(r / 128) * 3 + c / 128]; }, 8);
    const QuantizedWeight q = read_back(m, dir);
    EXPECT_EQ(q.group, 128);
    EXPECT_EQ(q.n_groups, 3);
    expect_decodes_to(q, m.want);
  }
}

// --- bad input: each names the tensor ---

void expect_error(Module& m, const std::string& part, ModuleScheme scheme = {}) {
  test::ScratchDir dir;
  const std::string msg = error_of([&] { read_back(m, dir, scheme); });
  EXPECT_NE(msg.find(part), std::string::npos) << "expected '" << part << "' in: " << msg;
}

TEST(QuantTensorsBadInput, ScaleOfTheWrongShape) {
  // A with a scale of 3 groups where 256 / 128 = 2 are expected.
  Module bad;
  bad.n = 8;
  bad.k = 256;
  std::vector<uint32_t> packed(8 * 32, 0);
  bad.add("weight_packed", DType::kI32, Shape{8, 32}, packed);
  bad.add("weight_scale", DType::kF32, Shape{8, 3}, std::vector<float>(24, 1.0f));
  expect_error(bad, "weight_scale");
}

TEST(QuantTensorsBadInput, PackedWidthInconsistentWithWeightShape) {
  Module bad;
  bad.n = 8;
  bad.k = 256;
  bad.add("weight_packed", DType::kI32, Shape{8, 31}, std::vector<uint32_t>(8 * 31, 0));
  bad.add("weight_scale", DType::kF32, Shape{8, 2}, std::vector<float>(16, 1.0f));
  expect_error(bad, "weight_packed");
  Module bad2;
  bad2.n = 8;
  bad2.k = 256;
  bad2.add("weight_packed", DType::kI32, Shape{8, 32}, std::vector<uint32_t>(8 * 32, 0));
  bad2.add("weight_scale", DType::kF32, Shape{8, 2}, std::vector<float>(16, 1.0f));
  bad2.add("weight_shape", DType::kI64, Shape{2}, std::vector<int64_t>{8, 512});
  expect_error(bad2, "weight_shape");
}

TEST(QuantTensorsBadInput, NanOrInfiniteScales) {
  Module bad;
  bad.n = 4;
  bad.k = 32;
  bad.add("weight", DType::kF8E4M3, Shape{4, 32}, std::vector<uint8_t>(128, 0x38));
  std::vector<float> s = {1, NAN, 1, 1};
  bad.add("weight_scale", DType::kF32, Shape{4, 1}, s);
  expect_error(bad, "scale of row 1");
  Module bad2;
  bad2.n = 4;
  bad2.k = 32;
  bad2.add("weight", DType::kU8, Shape{4, 16}, std::vector<uint8_t>(64, 0x11));
  bad2.add("weight_scale", DType::kF8E4M3, Shape{4, 2}, std::vector<uint8_t>(8, 0x38));
  bad2.add("weight_scale_2", DType::kF32, Shape{}, std::vector<float>{INFINITY});
  expect_error(bad2, "weight_scale_2");
}

TEST(QuantTensorsBadInput, NanFp8Code) {
  Module bad;
  bad.n = 2;
  bad.k = 16;
  std::vector<uint8_t> codes(32, 0x38);
  codes[19] = 0xFF;
  bad.add("weight", DType::kF8E4M3, Shape{2, 16}, codes);
  bad.add("weight_scale", DType::kF32, Shape{}, std::vector<float>{1.0f});
  expect_error(bad, "NaN code");
}

TEST(QuantTensorsBadInput, InputsNotAMultipleOfTheGroup) {
  Module bad;
  bad.n = 2;
  bad.k = 40;  // nvfp4 needs multiples of 16
  bad.add("weight", DType::kU8, Shape{2, 20}, std::vector<uint8_t>(40, 0));
  bad.add("weight_scale", DType::kF8E4M3, Shape{2, 2}, std::vector<uint8_t>(4, 0x38));
  bad.add("weight_scale_2", DType::kF32, Shape{}, std::vector<float>{1.0f});
  expect_error(bad, "multiple of NVFP4's group of 16");
  Module bad2;  // 3 groups of an int4 row of 320 without a stated group_size: not equal groups
  bad2.n = 8;
  bad2.k = 320;
  bad2.add("weight_packed", DType::kI32, Shape{8, 40}, std::vector<uint32_t>(8 * 40, 0));
  bad2.add("weight_scale", DType::kF32, Shape{8, 3}, std::vector<float>(24, 1.0f));
  expect_error(bad2, "equal groups");
}

TEST(QuantTensorsBadInput, GroupIndexOutOfRange) {
  Module bad;
  bad.n = 8;
  bad.k = 64;
  bad.add("weight_packed", DType::kI32, Shape{8, 8}, std::vector<uint32_t>(64, 0));
  bad.add("weight_scale", DType::kF32, Shape{8, 2}, std::vector<float>(16, 1.0f));
  std::vector<int32_t> gi(64, 0);
  gi[5] = 2;
  bad.add("weight_g_idx", DType::kI32, Shape{64}, gi);
  expect_error(bad, "g_idx[5] = 2");
}

TEST(QuantTensorsBadInput, UnknownTensorInTheModule) {
  Module m = pack_quantized(4, 8, 256, 128, false, false, 11);
  m.add("weight_mystery", DType::kF32, Shape{1}, std::vector<float>{1});
  expect_error(m, "weight_mystery");
}

TEST(QuantTensorsBadInput, SchemeContradictsTheTensors) {
  Module m = pack_quantized(4, 8, 256, 128, false, false, 12);
  ModuleScheme s;
  s.kind = ModuleScheme::Kind::kFloat8;
  s.bits = 8;
  s.rule = "config_groups.group_0 target 'Linear'";
  expect_error(m, "config_groups.group_0", s);
  Module m2 = pack_quantized(4, 8, 256, 128, false, false, 13);
  ModuleScheme s2;
  s2.kind = ModuleScheme::Kind::kInt;
  s2.bits = 4;
  s2.symmetric = false;
  s2.strategy = "group";
  s2.group_size = 128;
  s2.rule = "group_1";
  expect_error(m2, "symmetric (no weight_zero_point)", s2);
}

TEST(QuantTensors, JoinedPartsKeepEachPartsValues) {
  test::ScratchDir d1, d2;
  Module a = nvfp4(true, 8, 32, 14);
  Module b = nvfp4(true, 4, 32, 15);
  QuantizedWeight qa = read_back(a, d1);
  QuantizedWeight qb = read_back(b, d2);
  qb.scale_global *= 2;  // different globals: widened to f32 scales
  for (float& v : b.want) v *= 2;
  const QuantizedWeight j = join_quantized({qa, qb}, "a+b");
  EXPECT_EQ(j.n_out, 12);
  EXPECT_EQ(j.scale_dtype, DType::kF32);
  std::vector<float> want = a.want;
  want.insert(want.end(), b.want.begin(), b.want.end());
  expect_decodes_to(j, want, 1e-6f);
}

}  // namespace
}  // namespace metrale
