#include "io/safetensors/header.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "io/safetensors/strict_json.h"

namespace metrale {

using nlohmann::json;
using safetensors_detail::json_type_name;

namespace {

// Every dtype name the safetensors format defines that we can hold, for "expected" lists.
constexpr DType kAllDTypes[] = {DType::kF64,   DType::kF32,    DType::kF16,    DType::kBF16,
                                DType::kI64,   DType::kI32,    DType::kI16,    DType::kI8,
                                DType::kU8,    DType::kBool,   DType::kF8E4M3, DType::kF8E5M2,
                                DType::kE8M0,  DType::kE2M1};

std::string known_dtype_list() {
  std::string out;
  for (DType t : kAllDTypes) {
    if (!out.empty()) out += ", ";
    out += dtype_safetensors_name(t);
  }
  return out;
}

std::string shape_text(std::span<const int64_t> dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// A non-negative JSON integer that fits in int64 (shapes) or uint64 (offsets).
std::optional<uint64_t> as_unsigned(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

SafetensorsTensorInfo parse_entry(const std::string& name, const json& entry,
                                  uint64_t data_bytes, const std::string& where) {
  METRALE_CHECK(entry.is_object(), where, ": expected an object {dtype, shape, data_offsets}, found ",
                json_type_name(entry));
  for (const auto& [key, value] : entry.items()) {
    (void)value;
    METRALE_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where,
                  ": unexpected key '", key, "'; expected only dtype, shape, data_offsets");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    METRALE_CHECK(entry.contains(key), where, ": missing key '", key, "'");
  }

  SafetensorsTensorInfo info;
  info.name = name;

  const json& dtype = entry["dtype"];
  METRALE_CHECK(dtype.is_string(), where, ": dtype must be a string, found ", json_type_name(dtype));
  const auto parsed_dtype = dtype_from_safetensors(dtype.get_ref<const std::string&>());
  METRALE_CHECK(parsed_dtype.has_value(), where, ": unknown dtype \"",
                dtype.get_ref<const std::string&>(), "\"; expected one of ", known_dtype_list());
  info.dtype = *parsed_dtype;

  const json& shape = entry["shape"];
  METRALE_CHECK(shape.is_array(), where, ": shape must be an array of non-negative integers, found ",
                json_type_name(shape));
  METRALE_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), where, ": shape has rank ",
                shape.size(), "; metrale supports at most ", kMaxDims, " dimensions");
  std::vector<int64_t> dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    const auto d = as_unsigned(shape[i]);
    METRALE_CHECK(d.has_value(), where, ": shape[", i,
                  "] must be a non-negative integer, found ", json_type_name(shape[i]), " ",
                  shape[i].dump());
    METRALE_CHECK(*d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where,
                  ": shape[", i, "] = ", *d, " exceeds the largest supported dimension");
    dims.push_back(static_cast<int64_t>(*d));
  }

  const json& offsets = entry["data_offsets"];
  METRALE_CHECK(offsets.is_array() && offsets.size() == 2, where,
                ": data_offsets must be [begin, end], found ", offsets.dump());
  const auto begin = as_unsigned(offsets[0]);
  const auto end = as_unsigned(offsets[1]);
  METRALE_CHECK(begin.has_value() && end.has_value(), where,
                ": data_offsets must be two non-negative integers, found ", offsets.dump());
  info.begin = *begin;
  info.end = *end;
  METRALE_CHECK(info.begin <= info.end, where, ": data_offsets begin ", info.begin,
                " is after end ", info.end);
  METRALE_CHECK(info.end <= data_bytes, where, ": data_offsets [", info.begin, ", ", info.end,
                ") end outside the data section of ", data_bytes, " bytes (truncated file?)");

  const auto nbytes = safetensors_nbytes(info.dtype, dims);
  METRALE_CHECK(nbytes.has_value(), where, ": shape ", shape_text(dims), " x ",
                dtype_name(info.dtype), " overflows or does not fill whole bytes");
  METRALE_CHECK(*nbytes == info.nbytes(), where, ": shape ", shape_text(dims), " x ",
                dtype_name(info.dtype), " = ", *nbytes, " bytes, but data_offsets [", info.begin,
                ", ", info.end, ") span ", info.nbytes(), " bytes");
  info.shape = Shape(std::span<const int64_t>(dims));
  return info;
}

void parse_metadata(const json& meta, const std::string& source,
                    std::map<std::string, std::string>& out) {
  METRALE_CHECK(meta.is_object(), source, ": __metadata__ must be an object of strings, found ",
                json_type_name(meta));
  for (const auto& [key, value] : meta.items()) {
    METRALE_CHECK(value.is_string(), source, ": __metadata__['", key, "'] must be a string, found ",
                  json_type_name(value));
    out.emplace(key, value.get<std::string>());
  }
}

void check_no_overlap(const SafetensorsHeader& h, const std::string& source) {
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& t : h.tensors) {
    if (t.begin != t.end) by_offset.push_back(&t);  // empty tensors occupy no bytes
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  // Sorted by begin, a tensor can only overlap the earlier one reaching furthest.
  const SafetensorsTensorInfo* reach = nullptr;
  for (const auto* t : by_offset) {
    if (reach != nullptr) {
      METRALE_CHECK(reach->end <= t->begin, source, ": tensors '", reach->name, "' [", reach->begin,
                    ", ", reach->end, ") and '", t->name, "' [", t->begin, ", ", t->end,
                    ") overlap in the data section");
    }
    if (reach == nullptr || t->end > reach->end) reach = t;
  }
}

}  // namespace

std::optional<uint64_t> safetensors_nbytes(DType dtype, std::span<const int64_t> dims) {
  uint64_t numel = 1;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) return std::nullopt;
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_bits(dtype)), &bits)) {
    return std::nullopt;
  }
  if (bits % 8 != 0) return std::nullopt;
  return bits / 8;
}

const SafetensorsTensorInfo* SafetensorsHeader::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SafetensorsTensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes,
                                           std::string_view source_view) {
  const std::string source(source_view);
  const uint64_t size = file_bytes.size();
  METRALE_CHECK(size >= 8, source, ": file is ", size,
                " bytes, too short for the 8-byte header length (empty or truncated file)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<uint64_t>(file_bytes[static_cast<size_t>(i)]);
  METRALE_CHECK(n > 0, source, ": header length is 0; expected a JSON object of at least 2 bytes");
  METRALE_CHECK(n <= kMaxSafetensorsHeaderBytes, source, ": header length ", n,
                " exceeds the limit of ", kMaxSafetensorsHeaderBytes, " bytes (corrupt file?)");
  METRALE_CHECK(n <= size - 8, source, ": header length ", n, " exceeds the ", size - 8,
                " bytes after the length field (truncated file?)");

  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_offset = 8 + n;
  h.data_bytes = size - h.data_offset;

  const std::string_view text(reinterpret_cast<const char*>(file_bytes.data()) + 8, n);
  // Depth 3: the header object, a tensor entry, its shape / data_offsets array.
  const json root = safetensors_detail::parse_strict_json(text, source + ": header", 3);
  METRALE_CHECK(root.is_object(), source, ": header must be a JSON object, found ",
                json_type_name(root));

  h.tensors.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      parse_metadata(value, source, h.metadata);
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, h.data_bytes, source + ": tensor '" + key + "'"));
  }
  // nlohmann's object is a std::map, so the entries already arrive sorted and unique by name;
  // sorting again keeps find() correct if that container ever changes.
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  check_no_overlap(h, source);
  return h;
}

}  // namespace metrale
