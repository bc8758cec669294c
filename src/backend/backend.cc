#include "backend/backend.h"

#include "core/error.h"

namespace metrale {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kLinear: return "linear";
    case Op::kEmbedding: return "embedding";
    case Op::kRmsNorm: return "rms_norm";
    case Op::kRope: return "rope";
    case Op::kKvStore: return "kv_store";
    case Op::kAttention: return "attention";
    case Op::kGatedActivation: return "gated_activation";
    case Op::kArgmax: return "argmax";
  }
  return "unknown-op";
}

void Backend::require(Op op, WeightFormat format, DType dtype, std::string_view needed_by) const {
  METRALE_CHECK(supports(op, format, dtype), "backend ", name(), ": op ", op_name(op),
                " does not support weight format ", weight_format_name(format), " with dtype ",
                dtype_name(dtype), " (needed by '", needed_by, "')");
}

}  // namespace metrale
