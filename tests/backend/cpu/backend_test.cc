// CpuBackend memory and capability checks.
#include <gtest/gtest.h>

#include <cstdint>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

TEST(CpuBackend, AllocatesZeroedAlignedMemory) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, size_t{3} << 20}) {
    Buffer b = be.allocate(bytes);
    ASSERT_TRUE(b);
    EXPECT_EQ(b.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    if (bytes >= (size_t{2} << 20)) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t{2} << 20), 0u);
    }
    const auto* p = b.as<const uint8_t>();
    for (size_t i = 0; i < bytes; i += 511) ASSERT_EQ(p[i], 0);
    b.as<uint8_t>()[bytes - 1] = 7;  // the whole range is writable
    Buffer moved = std::move(b);
    EXPECT_FALSE(b);  // NOLINT(bugprone-use-after-move): moved-from is documented empty
    EXPECT_EQ(moved.as<uint8_t>()[bytes - 1], 7);
  }
}

TEST(CpuBackend, RequireNamesOpFormatAndTensor) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  EXPECT_TRUE(be.supports(Op::kLinear, WeightFormat::kBF16, DType::kF32));
  EXPECT_TRUE(be.supports(Op::kAttention, WeightFormat::kF32, DType::kF32));
  EXPECT_FALSE(be.supports(Op::kLinear, WeightFormat::kBF16, DType::kBF16));
  EXPECT_NO_THROW(be.require(Op::kLinear, WeightFormat::kF32, DType::kF32, "x"));
  try {
    be.require(Op::kLinear, WeightFormat::kBF16, DType::kF16,
               "model.layers.3.self_attn.o_proj.weight");
    FAIL();
  } catch (const Error& e) {
    for (const char* part : {"linear", "bf16", "f16", "o_proj"}) {
      EXPECT_NE(e.message().find(part), std::string::npos) << part << " in " << e.message();
    }
  }
}

}  // namespace
}  // namespace metrale
