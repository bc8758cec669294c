#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace metrale {
namespace {

TEST(Shape, Basics) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[2], 4);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  ASSERT_EQ(s.dims().size(), 3u);
  EXPECT_EQ(s.dims()[1], 3);
}

TEST(Shape, ScalarAndEmpty) {
  const Shape scalar;
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.str(), "[]");
  const Shape empty{4, 0, 3};
  EXPECT_EQ(empty.numel(), 0);
}

TEST(Shape, FromSpanAndEquality) {
  const std::vector<int64_t> dims = {5, 1, 7};
  const Shape a{std::span<const int64_t>(dims)};
  const Shape b{5, 1, 7};
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a == (Shape{5, 1}));
  EXPECT_FALSE(a == (Shape{5, 1, 8}));
  Shape c = b;
  c[2] = 8;
  EXPECT_EQ(c[2], 8);
  EXPECT_FALSE(b == c);
}

TEST(Shape, MaxRank) {
  const std::vector<int64_t> eight(kMaxDims, 2);
  EXPECT_EQ(Shape(std::span<const int64_t>(eight)).numel(), 256);
  const std::vector<int64_t> nine(kMaxDims + 1, 2);
  EXPECT_THROW(Shape{std::span<const int64_t>(nine)}, Error);
  EXPECT_THROW((Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
}

TEST(Shape, NegativeDimIsAnErrorNamingTheDim) {
  try {
    Shape s{2, -3};
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("-3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dimension 1"), std::string::npos) << msg;
  }
}

TEST(Shape, NumelOverflowIsAnError) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THROW((Shape{big, big}), Error);
  EXPECT_EQ((Shape{big, 1 << 20}).numel(), int64_t{1} << 60);
  EXPECT_NO_THROW((Shape{big, 0, big, big}));  // zero elements, no overflow
}

TEST(TensorView, Contiguous) {
  std::vector<float> data(24);
  const auto v = TensorView::contiguous(data.data(), DType::kF32, Shape{2, 3, 4});
  EXPECT_EQ(v.rank(), 3);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.nbytes(), 96u);
  EXPECT_EQ(v.as<float>(), data.data());
  EXPECT_EQ(v.str(), "f32[2, 3, 4]");
}

TEST(TensorView, StridedIsNotContiguous) {
  std::vector<uint16_t> data(64);
  auto v = TensorView::contiguous(data.data(), DType::kBF16, Shape{4, 8});
  v.shape[1] = 4;  // a column slice: rows keep their stride of 8
  EXPECT_FALSE(v.is_contiguous());
  auto t = TensorView::contiguous(data.data(), DType::kBF16, Shape{4, 8});
  std::swap(t.shape[0], t.shape[1]);  // a transpose
  std::swap(t.strides[0], t.strides[1]);
  EXPECT_FALSE(t.is_contiguous());
}

TEST(TensorView, SizeOneDimsMayHaveAnyStride) {
  std::vector<float> data(8);
  auto v = TensorView::contiguous(data.data(), DType::kF32, Shape{1, 8});
  v.strides[0] = 12345;
  EXPECT_TRUE(v.is_contiguous());
}

TEST(TensorView, PackedFp4Bytes) {
  std::vector<uint8_t> data(8);
  const auto v = TensorView::contiguous(data.data(), DType::kE2M1, Shape{2, 8});
  EXPECT_EQ(v.nbytes(), 8u);
  EXPECT_EQ(v.str(), "e2m1[2, 8]");
}

}  // namespace
}  // namespace metrale
