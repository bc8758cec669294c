#include "layers/norm.h"

namespace metrale {

Norm load_norm(TensorLoader& loader, const ModelConfig& config, const std::string& name,
               int64_t width) {
  return Norm{
      .weight = loader.norm(name, width),
      .eps = static_cast<float>(config.rms_norm_eps),
      .style = ships_vanilla_norm_weights(config) ? NormStyle::kWeight : NormStyle::kOnePlusWeight};
}

}  // namespace metrale
