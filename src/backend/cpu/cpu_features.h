#pragma once
// Run-time choice between the AVX-512 kernels (linear_packed, linear_quant, linear_quant_q8)
// and their portable twins: the CPU must have the kernel's features, and METRALE_CPU_PACK must
// not be "0" (the switch tests and users flip to run the twins).
#include <cstdlib>
#include <string_view>

namespace metrale::cpu {

// True unless METRALE_CPU_PACK is "0".
inline bool cpu_pack_allowed() {
  const char* env = std::getenv("METRALE_CPU_PACK");
  return env == nullptr || std::string_view(env) != "0";
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// AVX-512 F + BW, and with `vnni` also AVX-512 VNNI.
inline bool cpu_has_avx512(bool vnni = false) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         (!vnni || __builtin_cpu_supports("avx512vnni"));
}
#endif

}  // namespace metrale::cpu
