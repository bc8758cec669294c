#include "io/safetensors/writer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors/header.h"

namespace metrale {

namespace {

// The Python package (its Rust core) stores tensors in descending order of its dtype enum,
// which is roughly descending alignment, then by name, so that every tensor of a file it
// writes starts aligned. This is that enum's order for the dtypes metrale knows.
int package_order(DType t) {
  switch (t) {
    case DType::kBool:
      return 0;
    case DType::kE2M1:
      return 1;
    case DType::kU8:
      return 2;
    case DType::kI8:
      return 3;
    case DType::kF8E5M2:
      return 4;
    case DType::kF8E4M3:
      return 5;
    case DType::kE8M0:
      return 6;
    case DType::kI16:
      return 7;
    case DType::kF16:
      return 8;
    case DType::kBF16:
      return 9;
    case DType::kI32:
      return 10;
    case DType::kF32:
      return 11;
    case DType::kF64:
      return 12;
    case DType::kI64:
      return 13;
  }
  return 0;
}

}  // namespace

void SafetensorsWriter::add(std::string name, DType dtype, const Shape& shape,
                            std::span<const std::byte> bytes) {
  METRALE_CHECK(name != "__metadata__",
                "safetensors writer: '__metadata__' is reserved, not a tensor name");
  METRALE_CHECK(!names_.count(name), "safetensors writer: tensor '", name, "' added twice");
  const auto expected = safetensors_nbytes(dtype, shape.dims());
  METRALE_CHECK(expected.has_value(), "safetensors writer: tensor '", name, "': shape ",
                shape.str(), " x ", dtype_name(dtype), " overflows or does not fill whole bytes");
  METRALE_CHECK(*expected == bytes.size(), "safetensors writer: tensor '", name, "': shape ",
                shape.str(), " x ", dtype_name(dtype), " = ", *expected, " bytes, but ",
                bytes.size(), " bytes were given");
  names_.insert(name);
  entries_.push_back({std::move(name), dtype, shape, {bytes.begin(), bytes.end()}});
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::vector<std::byte> SafetensorsWriter::serialize() const {
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const int pa = package_order(a->dtype), pb = package_order(b->dtype);
    return pa != pb ? pa > pb : a->name < b->name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry* e : order) {
    nlohmann::ordered_json entry;
    entry["dtype"] = std::string(dtype_safetensors_name(e->dtype));
    entry["shape"] = std::vector<int64_t>(e->shape.dims().begin(), e->shape.dims().end());
    entry["data_offsets"] = {offset, offset + e->bytes.size()};
    offset += e->bytes.size();
    header[e->name] = std::move(entry);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<std::byte> out(8 + text.size() + offset);
  uint64_t n = text.size();
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::byte* data = out.data() + 8 + text.size();
  for (const Entry* e : order) {
    if (!e->bytes.empty()) std::memcpy(data, e->bytes.data(), e->bytes.size());
    data += e->bytes.size();
  }
  return out;
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  const std::vector<std::byte> bytes = serialize();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  METRALE_CHECK(out.good(), path.string(), ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  METRALE_CHECK(!out.fail(), path.string(), ": write failed");
}

}  // namespace metrale
