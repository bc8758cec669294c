// libFuzzer target for quantized modules: any bytes as a safetensors file must be read by
// read_quantized (module "m", shapes from the first two bytes) into a checked weight whose
// every row dequantizes, or refused with a metrale::Error — never a crash or a wrong-sized
// read. Seed with small files holding one module in each layout (fuzz/README.md).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_source.h"
#include "io/safetensors/checkpoint.h"
#include "weights/quant_tensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const std::filesystem::path dir =
      metrale::fuzz::scratch_dir("metrale-fuzz-quant_tensors_fuzz");
  {
    std::ofstream f(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data + 2), static_cast<std::streamsize>(size - 2));
  }
  const int64_t n_out = 1 + data[0] % 64;
  const int64_t n_in = 16 * (1 + data[1] % 16);
  try {
    const metrale::Checkpoint c = metrale::Checkpoint::open(dir);
    metrale::ModuleScheme any;
    any.kind = metrale::ModuleScheme::Kind::kAny;
    any.rule = "fuzz";
    const metrale::QuantizedWeight q = metrale::read_quantized(c, "m", any, n_out, n_in);
    const size_t row_bytes = metrale::weight_row_bytes(q.format, n_in);
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = 0; r < n_out; ++r) {
      metrale::dequantize_row(q.format, q.codes.data() + r * row_bytes, q.params(), r, n_in,
                              row.data());
    }
  } catch (const metrale::Error&) {
  }
  return 0;
}
