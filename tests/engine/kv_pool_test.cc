// KvPool's page reference counts (shared prefixes: serve/prefix_cache.h) and copy-on-write.
#include "engine/kv_pool.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/factory/backend_factory.h"
#include "core/thread_pool.h"
#include "support/test_support.h"

namespace metrale {
namespace {

using test::error_of;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class KvPoolRefs : public ::testing::Test {
 protected:
  ThreadPool threads_{1};
  std::unique_ptr<Backend> backend_ = make_backend({.device = "cpu", .pool = &threads_});
  // 2 layers of 2 kv heads x 8, a linear-attention layer (keeps nothing) between them, and
  // an MLA-like keys-only layer: 6 pages of 4 tokens.
  const std::vector<KvShape> shapes_ = {{2, 8, false}, {}, {1, 12, true}};
  KvPool pool_{*backend_, 6, 4, shapes_};
};

TEST_F(KvPoolRefs, ReserveRetainDropFree) {
  EXPECT_EQ(pool_.page_size(), 4);
  EXPECT_EQ(pool_.n_pages(), 6);
  EXPECT_EQ(pool_.bytes_per_page(), pool_.bytes_per_token() * 4);
  EXPECT_EQ(pool_.bytes_per_token(), static_cast<int64_t>((2 * 2 * 8 + 12) * sizeof(float)));
  std::vector<int32_t> a;
  pool_.reserve(a, 9);  // 3 pages
  ASSERT_EQ(a.size(), 3u);
  for (int32_t p : a) EXPECT_EQ(pool_.refs(p), 1);
  EXPECT_EQ(pool_.free_pages(), 3);

  // b shares a's first two pages (as a sequence adopting a cached prefix does).
  std::vector<int32_t> b(a.begin(), a.begin() + 2);
  pool_.retain(b);
  EXPECT_EQ(pool_.refs(a[0]), 2);
  EXPECT_EQ(pool_.refs(a[2]), 1);
  pool_.reserve(b, 12);  // a third page of its own
  EXPECT_EQ(pool_.free_pages(), 2);

  pool_.release(a);  // the shared pages stay with b; a's own third page is free again
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(pool_.refs(b[0]), 1);
  EXPECT_EQ(pool_.refs(b[1]), 1);
  EXPECT_EQ(pool_.free_pages(), 3);

  pool_.truncate(b, 5);  // keeps 2 pages
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(pool_.free_pages(), 4);
  pool_.retain(std::vector<int32_t>{b[0], b[0]});  // listed twice: two references
  EXPECT_EQ(pool_.refs(b[0]), 3);
  pool_.drop(std::vector<int32_t>{b[0], b[0]});
  pool_.release(b);
  EXPECT_EQ(pool_.free_pages(), 6);
}

TEST_F(KvPoolRefs, BadPagesAreNamedAndChangeNothing) {
  std::vector<int32_t> a;
  pool_.reserve(a, 4);
  const int32_t held = a[0];
  int32_t free_page = -1;
  for (int32_t p = 0; p < 6; ++p)
    if (pool_.refs(p) == 0) free_page = p;
  std::string e = error_of([&] { pool_.retain(std::vector<int32_t>{held, 6, -2}); });
  EXPECT_TRUE(contains(e, "6, -2") && contains(e, "outside the pool [0, 6)")) << e;
  e = error_of([&] { pool_.retain(std::vector<int32_t>{held, free_page}); });
  EXPECT_TRUE(contains(e, "free page(s) " + std::to_string(free_page))) << e;
  EXPECT_EQ(pool_.refs(held), 1);  // nothing retained
  e = error_of([&] { pool_.drop(std::vector<int32_t>{held, held}); });
  EXPECT_TRUE(contains(e, "page(s) " + std::to_string(held)) && contains(e, "fewer references"))
      << e;
  e = error_of([&] { pool_.drop(std::vector<int32_t>{free_page}); });
  EXPECT_TRUE(contains(e, std::to_string(free_page))) << e;
  EXPECT_EQ(pool_.refs(held), 1);
  EXPECT_TRUE(contains(error_of([&] { (void)pool_.refs(7); }), "page 7 is outside"));
  // A table naming a page it does not hold: the release is refused whole.
  std::vector<int32_t> bogus = {held, free_page};
  EXPECT_TRUE(contains(error_of([&] { pool_.release(bogus); }), std::to_string(free_page)));
  EXPECT_EQ(bogus.size(), 2u);
  EXPECT_EQ(pool_.refs(held), 1);
  pool_.release(a);
  EXPECT_TRUE(contains(error_of([&] { pool_.release(bogus); }), "fewer references"));
}

TEST_F(KvPoolRefs, UnshareCopiesEveryLayerIntoAPrivatePage) {
  std::vector<int32_t> a;
  pool_.reserve(a, 8);
  // Fill page a[1] in every layer that keeps something.
  for (int64_t i = 0; i < 3; ++i) {
    const KvLayerView l = pool_.layer(i);
    if (l.k == nullptr) continue;
    const int64_t n = l.layout.page_elems();
    auto* k = static_cast<float*>(l.k);
    auto* v = static_cast<float*>(l.v);
    for (int64_t j = 0; j < n; ++j) {
      k[a[1] * n + j] = static_cast<float>(j + 100 * i);
      if (v != nullptr) v[a[1] * n + j] = static_cast<float>(-j - 100 * i);
    }
  }
  std::vector<int32_t> b = a;
  pool_.unshare(b, 1);  // one reference (a's): nothing to copy
  EXPECT_EQ(b, a);
  pool_.retain(b);  // now b shares a's pages
  const int32_t shared = b[1];
  pool_.unshare(b, 1);
  EXPECT_NE(b[1], shared);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(pool_.refs(shared), 1);
  EXPECT_EQ(pool_.refs(b[1]), 1);
  for (int64_t i = 0; i < 3; ++i) {
    const KvLayerView l = pool_.layer(i);
    if (l.k == nullptr) continue;
    const int64_t n = l.layout.page_elems();
    const auto* k = static_cast<const float*>(l.k);
    const auto* v = static_cast<const float*>(l.v);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(k[b[1] * n + j], k[shared * n + j]) << "layer " << i;
      if (v != nullptr) {
        ASSERT_EQ(v[b[1] * n + j], v[shared * n + j]) << "layer " << i;
      }
    }
  }
  EXPECT_TRUE(contains(error_of([&] { pool_.unshare(b, 2); }), "entry 2 of a table of 2"));
  // No free page for the copy: refused, the table unchanged.
  std::vector<int32_t> rest;
  pool_.reserve(rest, 4 * pool_.free_pages());
  pool_.retain(std::vector<int32_t>{b[0]});
  const std::vector<int32_t> before = b;
  EXPECT_TRUE(contains(error_of([&] { pool_.unshare(b, 0); }), "kv cache full"));
  EXPECT_EQ(b, before);
  pool_.drop(std::vector<int32_t>{b[0]});
  pool_.release(rest);
  pool_.release(b);
  pool_.release(a);
  EXPECT_EQ(pool_.free_pages(), 6);
}

// A 16-bit pool: half the bytes per token, and copy-on-write moves its pages byte for byte.
TEST_F(KvPoolRefs, HalfPrecisionPoolHalvesBytesAndUnsharesItsPages) {
  KvPool half{*backend_, 6, 4, shapes_, DType::kF16};
  EXPECT_EQ(2 * half.bytes_per_token(), pool_.bytes_per_token());
  EXPECT_EQ(half.layout().dtype, DType::kF16);
  std::vector<int32_t> a;
  half.reserve(a, 4);
  for (int64_t i : {0, 2}) {
    const KvLayerView l = half.layer(i);
    EXPECT_EQ(l.layout.dtype, DType::kF16);
    auto* k = static_cast<uint16_t*>(l.k);
    for (int64_t j = 0; j < l.layout.page_elems(); ++j)
      k[a[0] * l.layout.page_elems() + j] = static_cast<uint16_t>(j * 7 + i);
  }
  std::vector<int32_t> b = a;
  half.retain(b);
  half.unshare(b, 0);
  ASSERT_NE(b[0], a[0]);
  for (int64_t i : {0, 2}) {
    const KvLayerView l = half.layer(i);
    const int64_t n = l.layout.page_elems();
    const auto* k = static_cast<const uint16_t*>(l.k);
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(k[b[0] * n + j], k[a[0] * n + j]) << "layer " << i;
  }
  half.release(b);
  half.release(a);
  EXPECT_TRUE(contains(error_of([&] { KvPool bad(*backend_, 6, 4, shapes_, DType::kI8); }),
                       "element type i8 is not one of f32, f16, bf16"));
}

}  // namespace
}  // namespace metrale
