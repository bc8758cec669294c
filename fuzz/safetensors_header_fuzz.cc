// libFuzzer target for the safetensors header parser: any bytes must either parse into a
// header whose every range is inside the input, or raise metrale::Error — never crash, hang
// or let an invalid range through. A parsed header is also re-written with the writer and
// parsed again, which must give the same tensors.
//
// Seeds and dictionary: tests/data/safetensors/interop.safetensors and
//   tests/data/safetensors/header_fuzz.dict, e.g.
//   ./safetensors_header_fuzz -dict=tests/data/safetensors/header_fuzz.dict corpus/
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "core/error.h"
#include "io/safetensors/header.h"
#include "io/safetensors/writer.h"

namespace {

void require(bool cond) {
  if (!cond) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  metrale::SafetensorsHeader h;
  try {
    h = metrale::parse_safetensors_header(bytes, "fuzz");
  } catch (const metrale::Error&) {
    return 0;
  }
  require(h.data_offset == 8 + h.header_bytes && h.data_offset + h.data_bytes == size);
  metrale::SafetensorsWriter writer;
  for (const auto& [k, v] : h.metadata) writer.set_metadata(k, v);
  for (const auto& t : h.tensors) {
    require(t.begin <= t.end && t.end <= h.data_bytes);
    const auto n = metrale::safetensors_nbytes(t.dtype, t.shape.dims());
    require(n.has_value() && *n == t.nbytes());
    writer.add(t.name, t.dtype, t.shape, bytes.subspan(h.data_offset + t.begin, t.nbytes()));
  }
  const std::vector<std::byte> again_bytes = writer.serialize();
  const metrale::SafetensorsHeader again =
      metrale::parse_safetensors_header(again_bytes, "rewritten");
  require(again.tensors.size() == h.tensors.size() && again.metadata == h.metadata);
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    require(again.tensors[i].name == h.tensors[i].name &&
            again.tensors[i].dtype == h.tensors[i].dtype &&
            again.tensors[i].shape == h.tensors[i].shape);
  }
  return 0;
}
