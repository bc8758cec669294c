#pragma once
// The builders of the families in this folder (one file each), for registry.cc.
#include <memory>

#include "layers/architecture.h"

namespace metrale {

std::unique_ptr<Architecture> build_dense_decoder(const ModelConfig& config,
                                                  TensorLoader& loader);  // dense.cc
std::unique_ptr<Architecture> build_qwen3_moe(const ModelConfig& config,
                                              TensorLoader& loader);  // qwen3_moe.cc
std::unique_ptr<Architecture> build_qwen3_next(const ModelConfig& config,
                                               TensorLoader& loader);  // qwen3_next.cc

}  // namespace metrale
