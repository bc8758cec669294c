#pragma once
// The builders of the families in this folder (one file each), for registry.cc.
#include <memory>
#include <string>
#include <vector>

#include "layers/architecture.h"
#include "layers/mtp_layer.h"

namespace metrale {

std::unique_ptr<Architecture> build_dense_decoder(const ModelConfig& config,
                                                  TensorLoader& loader);  // dense.cc
std::unique_ptr<Architecture> build_qwen2_vl(const ModelConfig& config,
                                             TensorLoader& loader);  // qwen2_vl.cc
std::unique_ptr<Architecture> build_qwen3_moe(const ModelConfig& config,
                                              TensorLoader& loader);  // qwen3_moe.cc
std::unique_ptr<Architecture> build_qwen3_next(const ModelConfig& config,
                                               TensorLoader& loader);  // qwen3_next.cc
std::unique_ptr<Architecture> build_deepseek_v3(const ModelConfig& config,
                                                TensorLoader& loader);  // deepseek_v3.cc
std::unique_ptr<Architecture> build_glm4_moe(const ModelConfig& config,
                                             TensorLoader& loader);  // glm4_moe.cc
std::unique_ptr<Architecture> build_glm4v(const ModelConfig& config,
                                          TensorLoader& loader);  // glm4v.cc
std::unique_ptr<Architecture> build_glm4v_moe(const ModelConfig& config,
                                              TensorLoader& loader);  // glm4v.cc

// Their MTP drafter layers (models/mtp_layers.h).
std::unique_ptr<MtpLayer> build_deepseek_v3_mtp(const ModelConfig& config,
                                                TensorLoader& loader);  // deepseek_v3.cc
std::unique_ptr<MtpLayer> build_glm4_moe_mtp(const ModelConfig& config,
                                             TensorLoader& loader);  // glm4_moe.cc
std::unique_ptr<MtpLayer> build_qwen3_next_mtp(const ModelConfig& config,
                                               TensorLoader& loader);  // qwen3_next.cc

// The multi-token-prediction layers DeepSeek-V3 / GLM-4.5 checkpoints append after their
// decoder layers: "model.layers.<n_layers + i>." for i < n_mtp_layers (deepseek_v3.cc).
std::vector<std::string> mtp_layer_prefixes(const ModelConfig& config);

}  // namespace metrale
