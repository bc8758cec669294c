#pragma once
// The model families this build runs, keyed by config.json's model_type. Adding a family is
// its file in this folder plus one line in registry.cc.
#include <memory>
#include <span>
#include <string_view>

#include "layers/architecture.h"
#include "layers/mtp_layer.h"

namespace metrale {

// Builds a family's Architecture from a checkpoint through `loader` (which checks every
// tensor against the shape the config implies and that none is left unclaimed).
using ArchitectureBuilder = std::unique_ptr<Architecture> (*)(const ModelConfig& config,
                                                              TensorLoader& loader);
// Builds the family's MTP drafter layer (models/mtp_layers.h) from the same checkpoint.
using MtpBuilder = std::unique_ptr<MtpLayer> (*)(const ModelConfig& config, TensorLoader& loader);

struct ArchitectureEntry {
  std::string_view model_type;
  ArchitectureBuilder build;
  MtpBuilder build_mtp = nullptr;  // nullptr: the family has no MTP drafter
};

std::span<const ArchitectureEntry> architectures();
// nullptr for a model_type no family builds.
const ArchitectureEntry* find_architecture(std::string_view model_type);

}  // namespace metrale
