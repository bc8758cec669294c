#pragma once
// VisionEncoder: runs a checkpoint's vision tower (layers/vision_tower.h) over the patches of
// one or more images / videos in one pass: the tower's recorded graph, its memory plan for up
// to max_patches rows and one arena, all made at load (nothing is allocated per call beyond
// the pass layout's small index arrays). encode()'s output rows are the language model's
// input embeddings for the items' placeholder tokens, in order (StepItem::embeds).
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "graph/executor.h"
#include "graph/plan.h"
#include "io/config/vision_config.h"
#include "layers/vision_tower.h"
#include "weights/tensor_loader.h"

namespace metrale {

class VisionEncoder {
 public:
  // The tower under `prefix` of the checkpoint `loader` reads, on `backend` (which must
  // outlive the encoder), for passes of at most max_patches patches.
  static std::unique_ptr<VisionEncoder> load(const VisionConfig& config, TensorLoader& loader,
                                             Backend& backend, const std::string& prefix,
                                             int64_t max_patches);

  const VisionConfig& config() const { return tower_->config(); }
  int64_t max_patches() const { return plan_.max_rows; }
  // Columns of encode()'s output rows: the merger's out_width, then out_width per deepstack
  // merger (Qwen3-VL), whose features the language model adds at its first layers.
  int64_t out_cols() const { return tower_->out_cols(); }
  const Graph& graph() const { return graph_; }

  // pixels: [sum of t h w, patch_dim] the items' pixel_values stacked in order (VisionItem's
  // layout); out: [pixels / merge^2, out_cols()]. Throws Error on a bad grid, a pixel row count
  // or width that does not match the grids, or more than max_patches() patches.
  void encode(std::span<const std::array<int64_t, 3>> grids, ConstRows pixels, Rows out);

 private:
  VisionEncoder() = default;

  Backend* backend_ = nullptr;
  std::unique_ptr<VisionTower> tower_;
  Graph graph_;
  GraphPlan plan_;
  Tensor pixels_, out_;
  Buffer arena_;
  std::unique_ptr<Executor> executor_;
};

}  // namespace metrale
