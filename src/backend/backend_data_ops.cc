// Backend's public ops that move rows and memory (gathers, scatters, sums, overlays, upload /
// download / copy / zero) and the vision tower's ops (rope_rows, layer_norm, activation,
// varlen_attention, merge_rows, tap_sum): validated here, then handed to the device (do_*), as
// in backend.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>

#include "backend/backend.h"
#include "backend/backend_checks.h"
#include "core/error.h"

namespace metrale {

using backend_checks::check_rows;
using backend_checks::check_span;
using backend_checks::Operand;

void Backend::gather_rows(ConstRows x, std::span<const int32_t> rows, Rows out) {
  const auto n = static_cast<int64_t>(rows.size());
  check_rows({"gather_rows", "", "out"}, out, n, x.n_cols);
  METRALE_CHECK(x.data != nullptr || x.n_rows == 0, "gather_rows: x: null data");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t r = rows[static_cast<size_t>(i)];
    METRALE_CHECK(r >= 0 && r < x.n_rows, "gather_rows: row ", i, " names row ", r, " of x's ",
                  x.n_rows);
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kGatherRows, nullptr);
  do_gather_rows(x, rows, out);
}

namespace {

// The overlay ops' shared checks: one slot per row, each -1 or an overlay of the pool.
void check_overlay_slots(std::string_view op, std::span<const int32_t> slots, int64_t n_rows,
                         size_t n_overlays) {
  check_span({op, "", "slots"}, slots, n_rows);
  for (size_t r = 0; r < slots.size(); ++r) {
    METRALE_CHECK(slots[r] >= -1 && slots[r] < static_cast<int64_t>(n_overlays), op, ": row ", r,
                  " names slot ", slots[r], " of ", n_overlays);
  }
}

}  // namespace

void Backend::token_overlay(const TokenOverlayArgs& a) {
  const int64_t n = a.h.n_rows;
  check_span({"token_overlay", "", "ids"}, a.ids, n);
  check_rows({"token_overlay", "", "h"}, a.h, n, a.h.n_cols);
  check_overlay_slots("token_overlay", a.slots, n, a.overlays.size());
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kTokenOverlay, nullptr);
  do_token_overlay(a);
}

void Backend::head_overlay(const HeadOverlayArgs& a) {
  const int64_t n = a.x.n_rows;
  check_rows({"head_overlay", "", "x"}, a.x, n, a.x.n_cols);
  check_rows({"head_overlay", "", "logits"}, a.logits, n, a.logits.n_cols);
  check_overlay_slots("head_overlay", a.slots, n, a.overlays.size());
  for (const LoraSlotOverlay& o : a.overlays) {
    if (o.head == nullptr) continue;
    check_linear(ConstRows{a.x.data, std::min<int64_t>(n, 1), a.x.n_cols, a.x.stride}, *o.head,
                 Rows{a.logits.data, std::min<int64_t>(n, 1), a.logits.n_cols, a.logits.stride});
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kHeadOverlay, nullptr);
  do_head_overlay(a);
}

void Backend::upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  METRALE_CHECK(dst != nullptr && host_src != nullptr, "upload: null pointer");
  const ObservedOp observe(*this, Op::kMemory, nullptr);
  do_upload(dst, host_src, bytes);
}

void Backend::download(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  METRALE_CHECK(host_dst != nullptr && src != nullptr, "download: null pointer");
  const ObservedOp observe(*this, Op::kMemory, nullptr);
  do_download(host_dst, src, bytes);
}

void Backend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  METRALE_CHECK(dst != nullptr && src != nullptr, "copy: null pointer");
  const auto* d = static_cast<const std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  METRALE_CHECK(d + bytes <= s || s + bytes <= d, "copy: the ranges overlap");
  const ObservedOp observe(*this, Op::kMemory, nullptr);
  do_copy(dst, src, bytes);
}

void Backend::zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  METRALE_CHECK(dst != nullptr, "zero: null pointer");
  const ObservedOp observe(*this, Op::kMemory, nullptr);
  do_zero(dst, bytes);
}

void Backend::scatter_rows(ConstRows x, std::span<const int32_t> rows, Rows out, bool add) {
  const auto n = static_cast<int64_t>(rows.size());
  check_rows({"scatter_rows", "", "x"}, x, n, out.n_cols);
  METRALE_CHECK(out.data != nullptr || out.n_rows == 0, "scatter_rows: out: null data");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t r = rows[static_cast<size_t>(i)];
    METRALE_CHECK(r >= 0 && r < out.n_rows, "scatter_rows: row ", i, " names row ", r, " of out's ",
                  out.n_rows);
    METRALE_CHECK(i == 0 || r > rows[static_cast<size_t>(i - 1)],
                  "scatter_rows: rows must be ascending (row ", i, " names ", r, " after ",
                  rows[static_cast<size_t>(i - 1)], ")");
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kScatterRows, nullptr);
  do_scatter_rows(x, rows, out, add);
}

void Backend::segment_sum(ConstRows x, std::span<const int32_t> offsets, Rows out) {
  const int64_t n = out.n_rows;
  check_rows({"segment_sum", "", "out"}, out, n, x.n_cols);
  METRALE_CHECK(x.data != nullptr || x.n_rows == 0, "segment_sum: x: null data");
  check_span({"segment_sum", "", "offsets"}, offsets, n + 1);
  METRALE_CHECK(offsets[0] == 0 && offsets[static_cast<size_t>(n)] == x.n_rows,
                "segment_sum: the segments cover rows [", offsets[0], ", ",
                offsets[static_cast<size_t>(n)], "); expected [0, ", x.n_rows, ")");
  for (int64_t s = 0; s < n; ++s) {
    METRALE_CHECK(offsets[static_cast<size_t>(s)] <= offsets[static_cast<size_t>(s + 1)],
                  "segment_sum: segment ", s, " ends at row ", offsets[static_cast<size_t>(s + 1)],
                  " before it starts (", offsets[static_cast<size_t>(s)], ")");
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kSegmentSum, nullptr);
  do_segment_sum(x, offsets, out);
}

void Backend::rope_rows(const RopeRowsArgs& a) {
  const int64_t n = a.cos.n_rows;
  METRALE_CHECK(a.half > 0 && a.inv_freq != nullptr && a.axes != nullptr,
                "rope_rows: no frequencies");
  check_rows({"rope_rows", "", "cos"}, a.cos, n, a.half);
  check_rows({"rope_rows", "", "sin"}, a.sin, n, a.half);
  check_span({"rope_rows", "", "positions"}, a.positions, 3 * n);
  for (size_t i = 0; i < a.positions.size(); ++i) {
    // Positions stay exact in float (2^24) as HF's float32 product has them.
    METRALE_CHECK(a.positions[i] >= 0 && a.positions[i] < (1 << 24), "rope_rows: position ",
                  a.positions[i], " (row ", i / 3, ", axis ", i % 3, ") is outside [0, 2^24)");
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kRopeRows, nullptr);
  do_rope_rows(a);
}

void Backend::layer_norm(const LayerNormArgs& a) {
  const int64_t n = a.x.n_cols;
  METRALE_CHECK(n > 0, "layer_norm: empty rows");
  METRALE_CHECK(a.weight != nullptr, "layer_norm: no weight");
  METRALE_CHECK(a.eps >= 0.0f, "layer_norm: negative eps ", a.eps);
  check_rows({"layer_norm", "", "input"}, a.x, a.x.n_rows, n);
  check_rows({"layer_norm", "", "output"}, a.out, a.x.n_rows, n);
  if (a.x.n_rows == 0) return;
  const ObservedOp observe(*this, Op::kLayerNorm, nullptr);
  do_layer_norm(a);
}

void Backend::activation(const ActivationArgs& a) {
  check_rows({"activation", "", "input"}, a.x, a.x.n_rows, a.x.n_cols);
  check_rows({"activation", "", "output"}, a.out, a.x.n_rows, a.x.n_cols);
  if (a.x.n_rows == 0) return;
  const ObservedOp observe(*this, Op::kActivation, nullptr);
  do_activation(a);
}

void Backend::varlen_attention(const VarlenAttentionArgs& a) {
  METRALE_CHECK(a.n_heads > 0 && a.head_dim > 0 && a.head_dim <= max_head_dim(),
                "varlen_attention: ", a.n_heads, " heads of ", a.head_dim,
                ": expected positive sizes, head_dim at most ", max_head_dim());
  METRALE_CHECK(std::isfinite(a.scale) && a.scale >= 0.0f, "varlen_attention: bad scale ", a.scale);
  const int64_t n = a.q.n_rows, width = a.n_heads * a.head_dim;
  if (n == 0 && a.cu_seqlens.size() <= 1) return;
  check_rows({"varlen_attention", "", "q"}, a.q, n, width);
  check_rows({"varlen_attention", "", "k"}, a.k, n, width);
  check_rows({"varlen_attention", "", "v"}, a.v, n, width);
  check_rows({"varlen_attention", "", "out"}, a.out, n, width);
  const std::span<const int32_t> cu = a.cu_seqlens;
  METRALE_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == n,
                "varlen_attention: ", "cu_seqlens must run from 0 to the ", n, " rows; found ",
                cu.size(), " values from ", cu.empty() ? -1 : cu.front(), " to ",
                cu.empty() ? -1 : cu.back());
  for (size_t s = 1; s < cu.size(); ++s) {
    METRALE_CHECK(cu[s] > cu[s - 1], "varlen_attention: cu_seqlens[", s, "] = ", cu[s],
                  " does not exceed cu_seqlens[", s - 1, "] = ", cu[s - 1], " (empty segment)");
  }
  for (ConstRows in : {a.q, a.k, a.v}) {
    const float* lo = in.data;
    const float* hi = in.data + (n - 1) * in.stride + in.n_cols;
    const float* olo = a.out.data;
    const float* ohi = a.out.data + (n - 1) * a.out.stride + a.out.n_cols;
    METRALE_CHECK(ohi <= lo || hi <= olo, "varlen_attention: out overlaps an input");
  }
  const ObservedOp observe(*this, Op::kVarlenAttention, nullptr);
  do_varlen_attention(a);
}

void Backend::merge_rows(ConstRows x, Rows out) {
  if (x.n_rows == 0 && out.n_rows == 0) return;
  METRALE_CHECK(out.n_rows > 0 && x.n_rows % out.n_rows == 0 &&
                    out.n_cols == x.n_rows / out.n_rows * x.n_cols,
                "merge_rows: [", x.n_rows, ", ", x.n_cols, "] does not regroup into [", out.n_rows,
                ", ", out.n_cols, "]");
  check_rows({"merge_rows", "", "x"}, x, x.n_rows, x.n_cols);
  check_rows({"merge_rows", "", "out"}, out, out.n_rows, out.n_cols);
  const ObservedOp observe(*this, Op::kMergeRows, nullptr);
  do_merge_rows(x, out);
}

void Backend::tap_sum(const TapSumArgs& a) {
  const int64_t n = a.out.n_rows, k = a.n_taps;
  check_rows({"tap_sum", "", "out"}, a.out, n, a.out.n_cols);
  METRALE_CHECK(k >= 1, "tap_sum: n_taps ", k);
  METRALE_CHECK(
      a.taps.size() == static_cast<size_t>(n * k) && a.weights.size() == static_cast<size_t>(n * k),
      "tap_sum: expected ", n * k, " taps and weights (", n, " rows x ", k, "), found ",
      a.taps.size(), " and ", a.weights.size());
  METRALE_CHECK(a.table != nullptr || n == 0, "tap_sum: null table");
  for (size_t i = 0; i < a.taps.size(); ++i) {
    METRALE_CHECK(a.taps[i] >= 0 && a.taps[i] < a.table_rows, "tap_sum: tap ", i, " names row ",
                  a.taps[i], " of the table's ", a.table_rows);
  }
  if (n == 0) return;
  const ObservedOp observe(*this, Op::kTapSum, nullptr);
  do_tap_sum(a);
}

}  // namespace metrale
