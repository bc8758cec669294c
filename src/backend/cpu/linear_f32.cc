// The f32 linear kernel: its own translation unit (one per weight format keeps builds
// parallel and lets a format's kernel change without recompiling the others).
// Highway re-includes this file once per target: these lines keep their order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/linear_f32.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on
#include "backend/cpu/linear-inl.h"

HWY_BEFORE_NAMESPACE();
namespace metrale::cpu::HWY_NAMESPACE {
void LinearF32(const LinearTask& t, int64_t o_begin, int64_t o_end) {
  LinearRange<float>(t, o_begin, o_end);
}
}  // namespace metrale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace metrale::cpu {
HWY_EXPORT(LinearF32);
void linear_f32(const LinearTask& t, int64_t o_begin, int64_t o_end) {
  HWY_DYNAMIC_DISPATCH(LinearF32)(t, o_begin, o_end);
}
}  // namespace metrale::cpu
#endif
