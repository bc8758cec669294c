#include "engine/vision_encoder.h"

#include <algorithm>

#include "core/error.h"

namespace metrale {

std::unique_ptr<VisionEncoder> VisionEncoder::load(const VisionConfig& config, TensorLoader& loader,
                                                   Backend& backend, const std::string& prefix,
                                                   int64_t max_patches) {
  METRALE_CHECK(max_patches >= config.merge_rows() && max_patches % config.merge_rows() == 0,
                "vision encoder: max_patches ", max_patches, " must be a positive multiple of ",
                config.merge_rows());
  auto e = std::unique_ptr<VisionEncoder>(new VisionEncoder());
  e->backend_ = &backend;
  e->tower_ = VisionTower::load(config, loader, prefix);
  e->pixels_ =
      e->graph_.buffer("pixels", config.patch_dim(), RowSpace::kRows, BufferKind::kExternal);
  e->out_ =
      e->graph_.buffer("out", e->tower_->out_cols(), RowSpace::kMerged, BufferKind::kExternal);
  e->tower_->record(e->graph_, e->pixels_, e->out_);
  e->plan_ = plan_graph(e->graph_, max_patches);
  e->arena_ = backend.allocate(std::max<size_t>(e->plan_.arena_bytes, 64));
  e->executor_ = std::make_unique<Executor>(e->graph_, e->plan_, e->arena_.data());
  return e;
}

void VisionEncoder::encode(std::span<const std::array<int64_t, 3>> grids, ConstRows pixels,
                           Rows out) {
  const VisionConfig& c = config();
  METRALE_CHECK(!grids.empty(), "vision encoder: no items");
  const VisionPassLayout layout = vision_pass_layout(grids, c.spatial_merge_size, tower_->window(),
                                                     tower_->pos_side(), tower_->pos_bicubic());
  METRALE_CHECK(layout.n_rows <= max_patches(), "vision encoder: ", layout.n_rows,
                " patches exceed the encoder's max_patches ", max_patches());
  METRALE_CHECK(pixels.n_rows == layout.n_rows && pixels.n_cols == c.patch_dim(),
                "vision encoder: pixel_values is [", pixels.n_rows, ", ", pixels.n_cols,
                "], the grids need [", layout.n_rows, ", ", c.patch_dim(), "]");
  METRALE_CHECK(out.n_rows == layout.n_merged && out.n_cols == out_cols(),
                "vision encoder: the output is [", out.n_rows, ", ", out.n_cols,
                "], the grids give [", layout.n_merged, ", ", out_cols(), "]");
  METRALE_CHECK(pixels.data != nullptr && out.data != nullptr, "vision encoder: null rows");
  // The graph only reads its pixel rows.
  executor_->bind(pixels_.buf, const_cast<float*>(pixels.data), pixels.stride);
  executor_->bind(out_.buf, out.data, out.stride);
  PassInputs in;
  in.n_rows = layout.n_rows;
  in.n_merged = layout.n_merged;
  in.positions3 = layout.positions3;
  in.row_index = layout.row_index;
  in.cu_seqlens = layout.cu_seqlens;
  in.cu_window_seqlens = layout.cu_window_seqlens;
  in.window_rows = layout.window_rows;
  in.merged_inverse = layout.merged_inverse;
  in.pos_taps = layout.pos_taps;
  in.pos_weights = layout.pos_weights;
  executor_->run(*backend_, in);
}

}  // namespace metrale
