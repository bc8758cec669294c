// Paged attention (decode and causal prefill) with a blockwise online softmax in f32: the
// keys of one query are visited in blocks of kBlock from the window start, so a query's
// result depends only on its position and its sequence's cache — never on the other rows
// of the call, how prefill was chunked, or the thread split. One work item is a (query
// row, kv head) pair so each K/V row is read once for all query heads of its GQA group.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kBlock = 32;         // keys per online-softmax step
constexpr int64_t kHeadsPerPass = 8;   // query heads sharing one K/V read

HWY_INLINE float Dot(const float* a, const float* b, int64_t n) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  VF acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) acc = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc);
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y = y * c
HWY_INLINE void Scale(float* y, float c, int64_t n) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const VF vc = hn::Set(df, c);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) hn::StoreU(hn::Mul(hn::LoadU(df, y + i), vc), df, y + i);
  for (; i < n; ++i) y[i] *= c;
}

// y += p * v
HWY_INLINE void Axpy(float p, const float* v, float* y, int64_t n) {
  const DF df;
  const auto nl = static_cast<int64_t>(hn::Lanes(df));
  const VF vp = hn::Set(df, p);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) hn::StoreU(hn::MulAdd(vp, hn::LoadU(df, v + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] += p * v[i];
}

void AttentionItems(const AttentionTask& t, int64_t item_begin, int64_t item_end) {
  const AttentionShape& sh = t.shape;
  const int64_t hd = sh.head_dim;
  const int64_t n_kv = sh.n_kv_heads;
  const int64_t group = sh.n_heads / n_kv;
  const int64_t page_size = t.cache.layout.page_size;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  HWY_ALIGN float acc[kHeadsPerPass][kMaxHeadDim];
  float scores[kHeadsPerPass][kBlock];
  int64_t slots[kBlock];
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t row = item / n_kv;
    const int64_t kvh = item % n_kv;
    const KvPageTable& table = t.table(row);
    const int64_t pos = t.position(row);
    const int64_t start = sh.sliding_window > 0 ? std::max<int64_t>(0, pos - sh.sliding_window + 1) : 0;
    for (int64_t h0 = 0; h0 < group; h0 += kHeadsPerPass) {
      const int64_t nh = std::min(kHeadsPerPass, group - h0);
      const float* q[kHeadsPerPass];
      float m[kHeadsPerPass];
      float l[kHeadsPerPass];
      for (int64_t j = 0; j < nh; ++j) {
        q[j] = t.q.row(row) + (kvh * group + h0 + j) * hd;
        m[j] = kNegInf;
        l[j] = 0.0f;
        std::fill(acc[j], acc[j] + hd, 0.0f);
      }
      for (int64_t t0 = start; t0 <= pos; t0 += kBlock) {
        const int64_t nb = std::min(kBlock, pos + 1 - t0);
        for (int64_t b = 0; b < nb; ++b) {
          slots[b] = table.slot(t0 + b, page_size);
          const float* k = t.cache.k_row(slots[b]) + kvh * hd;
          for (int64_t j = 0; j < nh; ++j) scores[j][b] = Dot(q[j], k, hd) * sh.scale;
        }
        for (int64_t j = 0; j < nh; ++j) {
          float block_max = scores[j][0];
          for (int64_t b = 1; b < nb; ++b) block_max = std::max(block_max, scores[j][b]);
          const float m_new = std::max(m[j], block_max);
          if (m[j] != kNegInf && m[j] != m_new) {
            const float c = std::exp(m[j] - m_new);
            l[j] *= c;
            Scale(acc[j], c, hd);
          }
          m[j] = m_new;
          for (int64_t b = 0; b < nb; ++b) {
            scores[j][b] = std::exp(scores[j][b] - m_new);
            l[j] += scores[j][b];
          }
        }
        for (int64_t b = 0; b < nb; ++b) {
          const float* v = t.cache.v_row(slots[b]) + kvh * hd;
          for (int64_t j = 0; j < nh; ++j) Axpy(scores[j][b], v, acc[j], hd);
        }
      }
      for (int64_t j = 0; j < nh; ++j) {
        float* out = t.out.row(row) + (kvh * group + h0 + j) * hd;
        const float inv = 1.0f / l[j];
        for (int64_t i = 0; i < hd; ++i) out[i] = acc[j][i] * inv;
      }
    }
  }
}

}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale::cpu {
HWY_EXPORT(AttentionItems);
void attention_items(const AttentionTask& t, int64_t item_begin, int64_t item_end) {
  HWY_DYNAMIC_DISPATCH(AttentionItems)(t, item_begin, item_end);
}
}  // namespace metrale::cpu
#endif
