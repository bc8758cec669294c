// DType names and sizes. The scalar and bulk conversions live in dtype_convert.cc.
#include "core/dtype.h"

#include <cstdint>

#include "core/error.h"

namespace metrale {
namespace {

struct DTypeInfo {
  DType type;
  int bits;
  bool is_float;
  std::string_view name;
  std::string_view safetensors;
};

// One row per DType, in enum order (checked by dtype_test).
constexpr DTypeInfo kInfo[] = {
    {DType::kF32, 32, true, "f32", "F32"},
    {DType::kF16, 16, true, "f16", "F16"},
    {DType::kBF16, 16, true, "bf16", "BF16"},
    {DType::kF8E4M3, 8, true, "f8_e4m3", "F8_E4M3"},
    {DType::kF8E5M2, 8, true, "f8_e5m2", "F8_E5M2"},
    // safetensors spells float4_e2m1fn_x2 "F4" and counts its shape in 4-bit elements.
    {DType::kE2M1, 4, true, "e2m1", "F4"},
    {DType::kE8M0, 8, true, "e8m0", "F8_E8M0"},
    {DType::kI8, 8, false, "i8", "I8"},
    {DType::kU8, 8, false, "u8", "U8"},
    {DType::kI32, 32, false, "i32", "I32"},
    {DType::kI64, 64, false, "i64", "I64"},
    {DType::kBool, 8, false, "bool", "BOOL"},
    {DType::kI16, 16, false, "i16", "I16"},
    {DType::kF64, 64, true, "f64", "F64"},
};
constexpr size_t kNumTypes = sizeof(kInfo) / sizeof(kInfo[0]);

constexpr bool info_in_enum_order() {
  for (size_t i = 0; i < kNumTypes; ++i) {
    if (static_cast<size_t>(kInfo[i].type) != i) return false;
  }
  return true;
}
static_assert(info_in_enum_order(), "kInfo rows must follow the DType enum order");

const DTypeInfo& info(DType t) {
  const auto i = static_cast<size_t>(t);
  METRALE_CHECK(i < kNumTypes, "invalid DType value ", i);
  return kInfo[i];
}

}  // namespace

int dtype_bits(DType t) { return info(t).bits; }

size_t dtype_bytes(DType t, size_t n) {
  const int bits = dtype_bits(t);
  if (bits == 4) {
    METRALE_CHECK(n % 2 == 0, dtype_name(t), " packs two elements per byte; expected an even ",
                  "element count, found ", n);
    return n / 2;
  }
  const size_t bytes = static_cast<size_t>(bits / 8);
  METRALE_CHECK(n <= SIZE_MAX / bytes, n, " elements of ", dtype_name(t),
                " overflow the size of a byte count");
  return n * bytes;
}

std::string_view dtype_name(DType t) { return info(t).name; }

std::string_view dtype_safetensors_name(DType t) { return info(t).safetensors; }

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (const DTypeInfo& row : kInfo) {
    if (row.safetensors == s) return row.type;
  }
  return std::nullopt;
}

bool dtype_is_float(DType t) { return info(t).is_float; }

}  // namespace metrale
