// CpuBackend::latent_attention: store this pass's latent rows, then per (row, head) two passes
// over the row's visible keys — the scores' max, then the sum of exp(score - max) with the
// weighted latents accumulated in key order — and a final division. The keys of a page are
// transposed ([dim][offset], kv_cache.h), so a score is a dot product down one column and the
// latent sum walks the same columns. Items (row, head) are independent: the thread split cannot
// change a result.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace metrale {
namespace {

// The dot product of q (dim values) with key `o` of a transposed page.
// q_latent . c + q_rope . k_rope for key `o` of a transposed page ([c | k_rope] down a column).
float key_dot(const float* q_latent, const float* q_rope, const float* page, int64_t rank,
              int64_t dim, int64_t page_size, int64_t o) {
  float s = 0.0f;
  for (int64_t d = 0; d < rank; ++d) s += q_latent[d] * page[d * page_size + o];
  for (int64_t d = rank; d < dim; ++d) s += q_rope[d - rank] * page[d * page_size + o];
  return s;
}

void attend(const LatentAttentionArgs& a, int64_t r, int64_t h) {
  const KvLayout& kv = a.cache.layout;
  const int64_t dim = kv.head_dim, rank = a.kv_rank, ps = kv.page_size;
  const KvPageTable& t = a.seqs[static_cast<size_t>(a.row_seq[static_cast<size_t>(r)])];
  const int64_t last = a.positions[static_cast<size_t>(r)];
  const int64_t rope = dim - rank;
  const float* ql = a.q_latent.row(r) + h * rank;
  const float* qr = a.q.row(r) + h * (a.nope_dim + rope) + a.nope_dim;
  float* out = a.out.row(r) + h * rank;
  auto page_of = [&](int64_t pos) {
    return a.cache.k_page(t.block_table[static_cast<size_t>(pos / ps)], 0);
  };
  float mx = -INFINITY;
  for (int64_t pos = 0; pos <= last; ++pos)
    mx = std::max(mx, a.scale * key_dot(ql, qr, page_of(pos), rank, dim, ps, pos % ps));
  std::fill(out, out + rank, 0.0f);
  float sum = 0.0f;
  for (int64_t pos = 0; pos <= last; ++pos) {
    const float* page = page_of(pos);
    const int64_t o = pos % ps;
    const float p = std::exp(a.scale * key_dot(ql, qr, page, rank, dim, ps, o) - mx);
    sum += p;
    for (int64_t d = 0; d < rank; ++d) out[d] += p * page[d * ps + o];
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
  pool_->parallel_for(static_cast<size_t>(n * a.n_heads), [&](size_t b, size_t e, int) {
    for (auto i = static_cast<int64_t>(b); i < static_cast<int64_t>(e); ++i)
      attend(a, i / a.n_heads, i % a.n_heads);
  });
}

}  // namespace metrale
