// KV caches stored as f16 / bf16 (KvLayout::dtype): kv_store rounds each value to nearest even
// (core/dtype's torch-equal conversion), and attention / latent attention over such a cache
// equal, bit for bit and on every SIMD target, the same kernels over an f32 cache holding the
// rounded values — widening is exact, so the element type changes the stored values only,
// never the arithmetic.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace metrale {
namespace {

using testing::random_vector;

// values rounded to `t` and widened back to f32.
std::vector<float> rounded(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> narrow(x.size());
  from_f32(x.data(), t, narrow.data(), x.size());
  std::vector<float> out(x.size());
  to_f32(narrow.data(), t, out.data(), x.size());
  return out;
}

// One layer's pages of element type `dtype`, filled with NaN bit patterns (an unwritten slot
// must never reach a result).
struct Pages {
  KvLayout layout;
  std::vector<std::byte> k, v;

  Pages(KvLayout l, DType dtype) : layout(l) {
    layout.dtype = dtype;
    const auto bytes = static_cast<size_t>(layout.layer_elems() * layout.elem_bytes());
    k.resize(bytes);
    v.resize(layout.keys_only ? 0 : bytes);
    for (std::vector<std::byte>* a : {&k, &v}) {
      if (dtype == DType::kF32) {
        auto* f = reinterpret_cast<float*>(a->data());
        std::fill(f, f + a->size() / sizeof(float), NAN);
      } else {
        auto* h = reinterpret_cast<uint16_t*>(a->data());
        std::fill(h, h + a->size() / sizeof(uint16_t), dtype == DType::kF16 ? 0x7E00 : 0x7FC0);
      }
    }
  }
  KvLayerView view() { return {k.data(), layout.keys_only ? nullptr : v.data(), layout}; }
};

struct Case {
  int64_t n_heads, n_kv_heads, head_dim, page_size;
};

// A sequence of `len` tokens stored through kv_store, then every row attended (causal prefill);
// the last row is what a decode step computes.
std::vector<float> store_and_attend(Backend& be, Pages& p, const Case& c, int64_t len,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const std::vector<float>& q) {
  std::vector<int32_t> blocks;
  const int64_t n_pages = (len + c.page_size - 1) / c.page_size;
  for (int64_t i = 0; i < n_pages; ++i) blocks.push_back(static_cast<int32_t>(n_pages - 1 - i));
  const KvPageTable table{blocks, len};
  std::vector<int64_t> slots;
  std::vector<int32_t> row_seq, pos;
  for (int64_t t = 0; t < len; ++t) {
    slots.push_back(table.slot(t, c.page_size));
    row_seq.push_back(0);
    pos.push_back(static_cast<int32_t>(t));
  }
  const int64_t re = c.n_kv_heads * c.head_dim, width = c.n_heads * c.head_dim;
  be.kv_store({.k = rows_of(k.data(), len, re),
               .v = rows_of(v.data(), len, re),
               .slots = slots,
               .cache = p.view()});
  std::vector<float> out(static_cast<size_t>(len * width));
  be.attention(
      {.q = rows_of(q.data(), len, width),
       .out = rows_of(out.data(), len, width),
       .cache = p.view(),
       .seqs = std::span(&table, 1),
       .row_seq = row_seq,
       .positions = pos,
       .shape = {.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim}});
  return out;
}

TEST(KvDtype, AttentionOverNarrowCacheEqualsF32CacheOfRoundedValues) {
  const Case cases[] = {{4, 4, 16, 4}, {8, 2, 32, 16}, {6, 3, 17, 5}, {16, 8, 128, 16}};
  for (const Case& c : cases) {
    for (DType t : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " heads=" << c.n_heads << "/"
                                        << c.n_kv_heads << " hd=" << c.head_dim);
      const int64_t len = 45, re = c.n_kv_heads * c.head_dim;
      const auto k = random_vector(static_cast<size_t>(len * re), 1, -2.0f, 2.0f);
      const auto v = random_vector(k.size(), 2);
      const auto q = random_vector(static_cast<size_t>(len * c.n_heads * c.head_dim), 3, -2, 2);
      const KvLayout layout{.n_pages = (len + c.page_size - 1) / c.page_size,
                            .page_size = c.page_size,
                            .n_kv_heads = c.n_kv_heads,
                            .head_dim = c.head_dim};
      ThreadPool pool(2);
      CpuBackend be(pool);
      testing::for_each_target([&] {
        Pages narrow(layout, t), wide(layout, DType::kF32);
        const auto got = store_and_attend(be, narrow, c, len, k, v, q);
        const auto want = store_and_attend(be, wide, c, len, rounded(k, t), rounded(v, t), q);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(testing::as_bits(got[i]), testing::as_bits(want[i])) << i;
      });
    }
  }
}

TEST(KvDtype, KvStoreRoundsToNearestEvenInTheCacheLayout) {
  const Case c{2, 2, 8, 4};
  const int64_t len = 6, re = c.n_kv_heads * c.head_dim;
  const KvLayout layout{.n_pages = 2, .page_size = c.page_size, .n_kv_heads = 2, .head_dim = 8};
  const auto k = random_vector(static_cast<size_t>(len * re), 4, -3.0f, 3.0f);
  const auto v = random_vector(k.size(), 5, -3.0f, 3.0f);
  ThreadPool pool(1);
  CpuBackend be(pool);
  for (DType t : {DType::kF16, DType::kBF16}) {
    Pages p(layout, t);
    std::vector<int64_t> slots(static_cast<size_t>(len));
    std::iota(slots.begin(), slots.end(), int64_t{1});  // slots 1..6: across both pages
    be.kv_store({.k = rows_of(k.data(), len, re),
                 .v = rows_of(v.data(), len, re),
                 .slots = slots,
                 .cache = p.view()});
    const KvLayerView view = p.view();
    for (int64_t i = 0; i < len; ++i) {
      const int64_t slot = slots[static_cast<size_t>(i)];
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t d = 0; d < 8; ++d) {
          const float kx = k[static_cast<size_t>(i * re + h * 8 + d)];
          const float vx = v[static_cast<size_t>(i * re + h * 8 + d)];
          const uint16_t want_k = t == DType::kF16 ? f32_to_f16(kx) : f32_to_bf16(kx);
          const uint16_t want_v = t == DType::kF16 ? f32_to_f16(vx) : f32_to_bf16(vx);
          EXPECT_EQ(view.k_page<uint16_t>(slot / 4, h)[d * 4 + slot % 4], want_k);
          EXPECT_EQ(view.v_row<uint16_t>(slot)[h * 8 + d], want_v);
        }
      }
    }
  }
}

// MLA's keys-only latent cache: the same equality through latent_attention.
std::vector<float> latent_attend(Backend& be, Pages& p, int64_t len, int64_t heads, int64_t rank,
                                 int64_t rope, const std::vector<float>& kv,
                                 const std::vector<float>& q_latent, const std::vector<float>& q) {
  const int64_t dim = rank + rope, ps = p.layout.page_size;
  std::vector<int32_t> blocks;
  for (int64_t i = 0; i < p.layout.n_pages; ++i)
    blocks.push_back(static_cast<int32_t>((i * 3) % p.layout.n_pages));
  const KvPageTable table{blocks, len};
  std::vector<int64_t> slots;
  std::vector<int32_t> row_seq, pos;
  for (int64_t t = 0; t < len; ++t) {
    slots.push_back(table.slot(t, ps));
    row_seq.push_back(0);
    pos.push_back(static_cast<int32_t>(t));
  }
  std::vector<float> out(static_cast<size_t>(len * heads * rank));
  be.latent_attention({.q_latent = rows_of(q_latent.data(), len, heads * rank),
                       .q = rows_of(q.data(), len, heads * rope),
                       .nope_dim = 0,
                       .kv = rows_of(kv.data(), len, dim),
                       .slots = slots,
                       .out = rows_of(out.data(), len, heads * rank),
                       .cache = p.view(),
                       .seqs = std::span(&table, 1),
                       .row_seq = row_seq,
                       .positions = pos,
                       .n_heads = heads,
                       .kv_rank = rank,
                       .scale = 0.2f});
  return out;
}

TEST(KvDtype, LatentAttentionOverNarrowCacheEqualsF32CacheOfRoundedValues) {
  const int64_t len = 21, heads = 17, rank = 37, rope = 8, dim = rank + rope;
  const KvLayout layout{
      .n_pages = 7, .page_size = 4, .n_kv_heads = 1, .head_dim = dim, .keys_only = true};
  const auto kv = random_vector(static_cast<size_t>(len * dim), 6, -1.5f, 1.5f);
  const auto ql = random_vector(static_cast<size_t>(len * heads * rank), 7, -0.5f, 0.5f);
  const auto q = random_vector(static_cast<size_t>(len * heads * rope), 8, -1.5f, 1.5f);
  ThreadPool pool(2);
  CpuBackend be(pool);
  for (DType t : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(t));
    testing::for_each_target([&] {
      Pages narrow(layout, t), wide(layout, DType::kF32);
      const auto got = latent_attend(be, narrow, len, heads, rank, rope, kv, ql, q);
      const auto want = latent_attend(be, wide, len, heads, rank, rope, rounded(kv, t), ql, q);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(testing::as_bits(got[i]), testing::as_bits(want[i])) << i;
    });
  }
}

TEST(KvDtype, RejectsElementTypesOtherThanF32F16Bf16) {
  ThreadPool pool(1);
  CpuBackend be(pool);
  KvLayout layout{.n_pages = 1, .page_size = 4, .n_kv_heads = 2, .head_dim = 8};
  Pages p(layout, DType::kF16);
  p.layout.dtype = DType::kF8E4M3;
  const auto x = random_vector(16, 9);
  const std::vector<int64_t> slots = {0};
  try {
    be.kv_store({.k = rows_of(x.data(), 1, 16),
                 .v = rows_of(x.data(), 1, 16),
                 .slots = slots,
                 .cache = p.view()});
    FAIL() << "an f8 KV cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache element type f8_e4m3"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace metrale
