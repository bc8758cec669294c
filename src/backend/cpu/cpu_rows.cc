// CpuBackend: the row-moving ops (gather_rows, scatter_rows, segment_sum, the LoRA token
// overlays) and the memory ops.
// Host memory: upload / download / copy are memcpy. The overlays touch a few rows of a step
// (the rows of slots that saved embed_tokens / lm_head or train tokens), so they run on the
// calling thread.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace metrale {

void CpuBackend::do_gather_rows(ConstRows x, std::span<const int32_t> rows, Rows out) {
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(x.row(rows[i]), x.n_cols, out.row(static_cast<int64_t>(i)));
}

void CpuBackend::do_scatter_rows(ConstRows x, std::span<const int32_t> rows, Rows out, bool add) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const float* src = x.row(static_cast<int64_t>(i));
    float* dst = out.row(rows[i]);
    if (add) {
      for (int64_t c = 0; c < x.n_cols; ++c) dst[c] += src[c];
    } else {
      std::copy_n(src, x.n_cols, dst);
    }
  }
}

void CpuBackend::do_segment_sum(ConstRows x, std::span<const int32_t> offsets, Rows out) {
  // A few pooled rows per step (one per embedding input): on the calling thread. The column
  // loop vectorises; each column still adds its rows in ascending order.
  for (int64_t s = 0; s < out.n_rows; ++s) {
    float* dst = out.row(s);
    for (int32_t r = offsets[static_cast<size_t>(s)]; r < offsets[static_cast<size_t>(s + 1)];
         ++r) {
      const float* src = x.row(r);
      for (int64_t c = 0; c < x.n_cols; ++c) dst[c] += src[c];
    }
  }
}

void CpuBackend::do_rope_rows(const RopeRowsArgs& a) {
  // RopeTable::build's arithmetic, per row: float product, then cos / sin in double.
  pool_->parallel_for(static_cast<size_t>(a.cos.n_rows), [&](size_t b, size_t e, int) {
    for (auto r = static_cast<int64_t>(b); r < static_cast<int64_t>(e); ++r) {
      const int32_t* pos = a.positions.data() + 3 * r;
      float* c = a.cos.row(r);
      float* s = a.sin.row(r);
      for (int64_t i = 0; i < a.half; ++i) {
        const float freq = static_cast<float>(pos[a.axes[i]]) * a.inv_freq[i];
        c[i] = static_cast<float>(std::cos(static_cast<double>(freq))) * a.scaling;
        s[i] = static_cast<float>(std::sin(static_cast<double>(freq))) * a.scaling;
      }
    }
  });
}

void CpuBackend::do_token_overlay(const TokenOverlayArgs& a) {
  const int64_t H = a.h.n_cols;
  for (size_t r = 0; r < a.ids.size(); ++r) {
    if (a.slots[r] < 0) continue;
    const LoraSlotOverlay& o = a.overlays[static_cast<size_t>(a.slots[r])];
    float* row = a.h.row(static_cast<int64_t>(r));
    if (o.embed != nullptr) std::copy_n(o.embed + static_cast<int64_t>(a.ids[r]) * H, H, row);
    const int32_t* end = o.token_ids + o.n_tokens;
    const int32_t* it = std::lower_bound(o.token_ids, end, a.ids[r]);
    if (it != end && *it == a.ids[r]) std::copy_n(o.token_rows + (it - o.token_ids) * H, H, row);
  }
}

void CpuBackend::do_head_overlay(const HeadOverlayArgs& a) {
  const int64_t H = a.x.n_cols;
  for (int64_t r = 0; r < a.x.n_rows; ++r) {
    const int32_t s = a.slots[static_cast<size_t>(r)];
    if (s < 0) continue;
    const LoraSlotOverlay& o = a.overlays[static_cast<size_t>(s)];
    const ConstRows xr{a.x.row(r), 1, a.x.n_cols, a.x.stride};
    // One row through the saved head, as linear() computes it (a row's result never depends
    // on its company).
    if (o.head != nullptr)
      do_linear(xr, *o.head, Rows{a.logits.row(r), 1, a.logits.n_cols, a.logits.stride});
    if (!o.tied_tokens) continue;
    // The tied head's rows of the trainable tokens are their new rows too.
    for (int64_t k = 0; k < o.n_tokens; ++k) {
      const float* w = o.token_rows + k * H;
      float acc = 0.0f;
      for (int64_t d = 0; d < H; ++d) acc += w[d] * xr.row(0)[d];
      a.logits.row(r)[o.token_ids[k]] = acc;
    }
  }
}

void CpuBackend::do_upload(void* dst, const void* host_src, size_t bytes) {
  std::memcpy(dst, host_src, bytes);
}
void CpuBackend::do_download(void* host_dst, const void* src, size_t bytes) {
  std::memcpy(host_dst, src, bytes);
}
void CpuBackend::do_copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::do_zero(void* dst, size_t bytes) { std::memset(dst, 0, bytes); }

}  // namespace metrale
