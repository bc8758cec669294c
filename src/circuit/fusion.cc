#include "circuit/fusion.h"

#include <utility>

#include "core/error.h"

namespace metrale {

FusionPolicy parse_fusion(std::string_view text, std::string_view flag) {
  if (text == "none") return {};
  if (text == "default") return FusionPolicy::all();
  FusionPolicy p;
  size_t at = 0;
  for (;;) {
    const size_t comma = text.find(',', at);
    const std::string_view name =
        text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    if (name == "residual") {
      p.residual = true;
    } else if (name == "gate_up") {
      p.gate_up = true;
    } else if (name == "norm") {
      p.norm = true;
    } else {
      throw Error(std::string(flag) +
                  ": expected none, default or a comma-separated list of residual, gate_up, "
                  "norm; found '" +
                  std::string(name) + "' in '" + std::string(text) + "'");
    }
    if (comma == std::string_view::npos) return p;
    at = comma + 1;
  }
}

std::string fusion_name(const FusionPolicy& p) {
  if (!p.any()) return "none";
  if (p.residual && p.gate_up && p.norm) return "default";
  std::string s;
  for (const auto& [on, name] : {std::pair{p.residual, "residual"}, std::pair{p.gate_up, "gate_up"},
                                 std::pair{p.norm, "norm"}}) {
    if (!on) continue;
    if (!s.empty()) s += ',';
    s += name;
  }
  return s;
}

}  // namespace metrale
