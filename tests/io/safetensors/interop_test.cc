// Reads a file written by the Python `safetensors` package (tools/fixtures/safetensors/
// make_interop.py) and checks names, dtypes, shapes, bytes, metadata, torch's values, and
// that our writer reproduces the file byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/safetensors/file.h"
#include "io/safetensors/writer.h"
#include "test_util.h"

namespace metrale {
namespace {

constexpr const char* kFile = "tests/data/safetensors/interop.safetensors";
constexpr const char* kExpected = "tests/data/safetensors/interop_expected.json";

nlohmann::json expected() {
  std::ifstream in(kExpected);
  EXPECT_TRUE(in.good()) << kExpected;
  return nlohmann::json::parse(in);
}

std::vector<std::byte> from_hex(const std::string& hex) {
  std::vector<std::byte> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<std::byte>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

double expected_value(const nlohmann::json& v) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "nan") return std::nan("");
    return s == "inf" ? INFINITY : -INFINITY;
  }
  return v.get<double>();
}

// Element i of a float tensor, through metrale's scalar conversions.
double decode_float(DType t, const std::byte* p, size_t i) {
  auto u8 = [&](size_t k) { return std::to_integer<uint8_t>(p[k]); };
  switch (t) {
    case DType::kF64: {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      return d;
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case DType::kF16:
      return f16_to_f32(static_cast<uint16_t>(u8(2 * i) | (u8(2 * i + 1) << 8)));
    case DType::kBF16:
      return bf16_to_f32(static_cast<uint16_t>(u8(2 * i) | (u8(2 * i + 1) << 8)));
    case DType::kF8E4M3:
      return f8e4m3_to_f32(u8(i));
    case DType::kF8E5M2:
      return f8e5m2_to_f32(u8(i));
    case DType::kE8M0:
      return e8m0_to_f32(u8(i));
    default:
      ADD_FAILURE() << "not a float dtype";
      return 0;
  }
}

int64_t decode_int(DType t, const std::byte* p, size_t i) {
  switch (t) {
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::kI16: {
      int16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    case DType::kI8:
      return static_cast<int8_t>(std::to_integer<uint8_t>(p[i]));
    case DType::kU8:
    case DType::kBool:
      return std::to_integer<uint8_t>(p[i]);
    default:
      ADD_FAILURE() << "not an integer dtype";
      return 0;
  }
}

TEST(SafetensorsInterop, ReadsWhatThePythonPackageWrote) {
  const nlohmann::json exp = expected();
  const SafetensorsFile f = SafetensorsFile::open(kFile);
  EXPECT_EQ(f.metadata().size(), exp["metadata"].size());
  for (const auto& [k, v] : exp["metadata"].items())
    EXPECT_EQ(f.metadata().at(k), v.get<std::string>());

  ASSERT_EQ(f.tensors().size(), exp["tensors"].size());
  std::set<DType> seen;
  for (const auto& [name, e] : exp["tensors"].items()) {
    SCOPED_TRACE(name);
    const auto& t = f.at(name);
    seen.insert(t.dtype);
    EXPECT_EQ(dtype_safetensors_name(t.dtype), e["dtype"].get<std::string>());
    const auto dims = e["shape"].get<std::vector<int64_t>>();
    EXPECT_EQ(t.shape, Shape(std::span<const int64_t>(dims)));
    const auto bytes = f.bytes(t);
    const auto want = from_hex(e["hex"].get<std::string>());
    ASSERT_EQ(bytes.size(), want.size());
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), want.begin()));
    EXPECT_TRUE(f.is_aligned(t));
    if (!e.contains("values")) continue;  // packed fp4: torch gives bytes only
    const auto& values = e["values"];
    ASSERT_EQ(values.size(), static_cast<size_t>(t.shape.numel()));
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype_is_float(t.dtype)) {
        const double want_v = expected_value(values[i]);
        const double got = decode_float(t.dtype, bytes.data(), i);
        if (std::isnan(want_v)) {
          EXPECT_TRUE(std::isnan(got)) << "element " << i;
        } else {
          EXPECT_EQ(got, want_v) << "element " << i;
          EXPECT_EQ(std::signbit(got), std::signbit(want_v)) << "element " << i;
        }
      } else {
        EXPECT_EQ(decode_int(t.dtype, bytes.data(), i), values[i].get<int64_t>())
            << "element " << i;
      }
    }
  }
  // The fixture covers every dtype metrale defines.
  EXPECT_EQ(seen.size(), 14u);
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2, DType::kE8M0, DType::kE2M1})
    EXPECT_EQ(seen.count(t), 1u);
}

TEST(SafetensorsInterop, WriterReproducesThePackageByteForByte) {
  const SafetensorsFile f = SafetensorsFile::open(kFile);
  SafetensorsWriter w;
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  for (const auto& t : f.tensors()) w.add(t.name, t.dtype, t.shape, f.bytes(t));
  EXPECT_EQ(w.serialize(), test::read_bytes(kFile));
}

}  // namespace
}  // namespace metrale
