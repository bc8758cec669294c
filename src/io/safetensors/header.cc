#include "io/safetensors/header.h"

#include <algorithm>

#include "core/error.h"
#include "io/json/json_fields.h"
#include "io/safetensors/strict_json.h"

namespace metrale {

using nlohmann::json;

namespace {

// Every dtype name the safetensors format defines that we can hold, for "expected" lists.
constexpr DType kAllDTypes[] = {DType::kF64,  DType::kF32,  DType::kF16,    DType::kBF16,
                                DType::kI64,  DType::kI32,  DType::kI16,    DType::kI8,
                                DType::kU8,   DType::kBool, DType::kF8E4M3, DType::kF8E5M2,
                                DType::kE8M0, DType::kE2M1};

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

SafetensorsTensorInfo parse_entry(const std::string& name, const json& entry, uint64_t data_bytes,
                                  const std::string& where) {
  METRALE_CHECK(entry.is_object(), where,
                ": expected an object {dtype, shape, data_offsets}, found ",
                describe_json_value(entry));
  const JsonFields f(entry, where);
  for (const auto& [key, value] : entry.items()) {
    (void)value;
    METRALE_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where,
                  ": unexpected key '", key, "'; expected only dtype, shape, data_offsets");
  }

  SafetensorsTensorInfo info;
  info.name = name;

  const std::string dtype = f.req_string("dtype");
  const auto parsed_dtype = dtype_from_safetensors(dtype);
  if (!parsed_dtype)
    throw f.error("dtype", "unknown dtype \"", dtype, "\"; expected one of ", known_dtype_list());
  info.dtype = *parsed_dtype;

  const std::optional<std::vector<int64_t>> dims = f.opt_int_list("shape", 0);
  if (!dims) throw f.missing("shape", "a list of non-negative integers");
  if (dims->size() > static_cast<size_t>(kMaxDims)) {
    throw f.error("shape", "rank ", dims->size(), "; metrale supports at most ", kMaxDims,
                  " dimensions");
  }

  const std::optional<std::vector<int64_t>> offsets = f.opt_int_list("data_offsets", 0);
  if (!offsets) throw f.missing("data_offsets", "[begin, end]");
  if (offsets->size() != 2) {
    throw f.error("data_offsets", "expected [begin, end], found ",
                  describe_json_value(entry["data_offsets"]));
  }
  info.begin = static_cast<uint64_t>((*offsets)[0]);
  info.end = static_cast<uint64_t>((*offsets)[1]);
  METRALE_CHECK(info.begin <= info.end, where, ": data_offsets begin ", info.begin,
                " is after end ", info.end);
  METRALE_CHECK(info.end <= data_bytes, where, ": data_offsets [", info.begin, ", ", info.end,
                ") end outside the data section of ", data_bytes, " bytes (truncated file?)");

  const auto nbytes = safetensors_nbytes(info.dtype, *dims);
  METRALE_CHECK(nbytes.has_value(), where, ": shape ", shape_text(*dims), " x ",
                dtype_name(info.dtype), " overflows or does not fill whole bytes");
  METRALE_CHECK(*nbytes == info.nbytes(), where, ": shape ", shape_text(*dims), " x ",
                dtype_name(info.dtype), " = ", *nbytes, " bytes, but data_offsets [", info.begin,
                ", ", info.end, ") span ", info.nbytes(), " bytes");
  info.shape = Shape(std::span<const int64_t>(*dims));
  return info;
}

void parse_metadata(const json& meta, const std::string& source,
                    std::map<std::string, std::string>& out) {
  const JsonFields f(meta, source, "__metadata__");
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string())
      throw f.error(key, "expected a string, found ", describe_json_value(value));
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
    if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
      return std::nullopt;
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_bits(dtype)), &bits)) {
    return std::nullopt;
  }
  if (bits % 8 != 0) return std::nullopt;
  return bits / 8;
}

const SafetensorsTensorInfo* SafetensorsHeader::find(std::string_view name) const {
  auto it = std::lower_bound(
      tensors.begin(), tensors.end(), name,
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
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | std::to_integer<uint64_t>(file_bytes[static_cast<size_t>(i)]);
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
                describe_json_value(root));

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
