// CpuBackend::latent_attention: store this pass's latent rows, then per (row, head): the scores
// of the row's visible keys page by page into per-thread scratch, their max, exp(score - max)
// summed in key order, the weighted latents accumulated in key order, and a final division.
// The keys of a page are transposed ([dim][offset], kv_cache.h), so both the scores (one dot
// product per offset) and the latent sums run along contiguous offsets. Items (row, head) are
// independent and each sums in a fixed order: the thread split and the chunking of a prefill
// cannot change a result.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

void attend(const LatentAttentionArgs& a, int64_t r, int64_t h, float* scores) {
  const KvLayout& kv = a.cache.layout;
  const int64_t dim = kv.head_dim, rank = a.kv_rank, rope = dim - rank, ps = kv.page_size;
  const KvPageTable& t = a.seqs[static_cast<size_t>(a.row_seq[static_cast<size_t>(r)])];
  const int64_t n_keys = a.positions[static_cast<size_t>(r)] + 1;
  const float* ql = a.q_latent.row(r) + h * rank;
  const float* qr = a.q.row(r) + h * (a.nope_dim + rope) + a.nope_dim;
  float* out = a.out.row(r) + h * rank;
  auto page_at = [&](int64_t first) {
    return a.cache.k_page(t.block_table[static_cast<size_t>(first / ps)], 0);
  };
  // Scores: q_latent . c + q_rope . k_rope, summed over the dims in order.
  for (int64_t first = 0; first < n_keys; first += ps) {
    const float* page = page_at(first);
    const int64_t n = std::min(ps, n_keys - first);
    float* s = scores + first;
    std::fill(s, s + n, 0.0f);
    for (int64_t d = 0; d < dim; ++d) {
      const float q = d < rank ? ql[d] : qr[d - rank];
      const float* col = page + d * ps;
      for (int64_t o = 0; o < n; ++o) s[o] += q * col[o];
    }
  }
  float mx = -INFINITY;
  for (int64_t i = 0; i < n_keys; ++i) mx = std::max(mx, scores[i] *= a.scale);
  float sum = 0.0f;
  for (int64_t i = 0; i < n_keys; ++i) sum += scores[i] = std::exp(scores[i] - mx);
  std::fill(out, out + rank, 0.0f);
  for (int64_t first = 0; first < n_keys; first += ps) {
    const float* page = page_at(first);
    const int64_t n = std::min(ps, n_keys - first);
    const float* p = scores + first;
    for (int64_t d = 0; d < rank; ++d) {
      const float* col = page + d * ps;
      float acc = out[d];
      for (int64_t o = 0; o < n; ++o) acc += p[o] * col[o];
      out[d] = acc;
    }
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < rank; ++d) out[d] *= inv;
}

}  // namespace

void CpuBackend::do_latent_attention(const LatentAttentionArgs& a) {
  const KvLayout& kv = a.cache.layout;
  const int64_t n = a.q.n_rows;
  pool_->parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e, int) {
    for (auto r = static_cast<int64_t>(b); r < static_cast<int64_t>(e); ++r) {
      const int64_t slot = a.slots[static_cast<size_t>(r)];
      float* col = a.cache.k_page(slot / kv.page_size, 0) + slot % kv.page_size;
      const float* x = a.kv.row(r);
      for (int64_t d = 0; d < kv.head_dim; ++d) col[d * kv.page_size] = x[d];
    }
  });
  // Scores of as many keys as the cache holds: sized once, so a growing sequence never
  // allocates in a later step.
  const size_t per_thread = static_cast<size_t>(kv.n_slots() + 15) / 16 * 16;
  float* scratch = thread_scratch(per_thread);
  pool_->parallel_for(static_cast<size_t>(n * a.n_heads), [&](size_t b, size_t e, int t) {
    for (auto i = static_cast<int64_t>(b); i < static_cast<int64_t>(e); ++i)
      attend(a, i / a.n_heads, i % a.n_heads, scratch + static_cast<size_t>(t) * per_thread);
  });
}

}  // namespace metrale
