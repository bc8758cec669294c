#include "weights/tensor_loader.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "quant/weight_format.h"
#include "weights/quant_tensors.h"

namespace metrale {

TensorLoader::TensorLoader(const Checkpoint& checkpoint, Backend& backend,
                           WeightPlacement placement, void (*progress)(uint64_t, uint64_t))
    : checkpoint_(checkpoint), backend_(backend), placement_(placement), progress_(progress) {}

const CheckpointTensor& TensorLoader::claim(const std::string& name,
                                            std::initializer_list<int64_t> shape) {
  const CheckpointTensor* t = checkpoint_.find(name);
  METRALE_CHECK(t != nullptr, checkpoint_.dir().string(), ": missing tensor '", name,
                "' (expected shape ", Shape(shape).str(), ")");
  METRALE_CHECK(t->info->shape == Shape(shape), checkpoint_.dir().string(), ": tensor '", name,
                "' has shape ", t->info->shape.str(), ", expected ", Shape(shape).str(),
                " from config.json");
  claimed_.insert(name);
  return *t;
}

const Buffer& TensorLoader::staging_for(size_t bytes) {
  // One staging buffer for the whole load, grown as needed: a mapping per tensor costs the
  // kernel a huge-page fault-in and an unmap for every expert of an MoE checkpoint.
  if (staging_.size() < bytes) {
    staging_ = Buffer();
    staging_ = backend_.allocate(bytes);
  }
  return staging_;
}

void TensorLoader::advance(uint64_t bytes) {
  done_ += bytes;
  if (progress_ != nullptr) progress_(done_, checkpoint_.total_bytes());
}

// Copy into backend memory (streamed, releasing the mapped pages as it goes), or read in
// place when asked and the tensor is aligned for its element type.
const void* TensorLoader::place(const CheckpointTensor& t) {
  const bool aligned = t.file->is_aligned(*t.info);
  if (placement_ == WeightPlacement::kInPlace && aligned) return t.bytes().data();
  auto buffer = std::make_shared<Buffer>(backend_.allocate(t.info->nbytes()));
  checkpoint_.copy_to(t.info->name, {buffer->as<std::byte>(), buffer->size()});
  const void* data = buffer->data();
  storage_.push_back(std::move(buffer));
  return data;
}

WeightTensor TensorLoader::matrix(const std::string& name, int64_t n_out, int64_t n_in) {
  return linear_impl(name, nullptr, n_out, n_in);
}

WeightTensor TensorLoader::linear(const std::string& prefix, int64_t n_out, int64_t n_in,
                                  bool has_bias) {
  const ModuleScheme scheme = scheme_of(prefix);
  if (quantized(prefix, scheme))
    return quantized_linear({prefix}, {n_out}, n_in, has_bias, prefix + ".weight");
  const std::string bias_name = prefix + ".bias";
  WeightTensor w = linear_impl(prefix + ".weight", has_bias ? &bias_name : nullptr, n_out, n_in);
  report(prefix, std::string(weight_format_name(w.format)), scheme.rule);
  return w;
}

ModuleScheme TensorLoader::scheme_of(const std::string& prefix) const {
  if (quant_ != nullptr) return quant_->scheme_for(prefix);
  ModuleScheme s;
  s.kind = ModuleScheme::Kind::kAny;
  s.rule = "no quantization config: the tensors decide";
  return s;
}

bool TensorLoader::quantized(const std::string& prefix, const ModuleScheme& scheme) const {
  const bool has = has_quantized_tensors(checkpoint_, prefix);
  switch (scheme.kind) {
    case ModuleScheme::Kind::kUnquantized:
      METRALE_CHECK(!has, checkpoint_.dir().string(), ": module '", prefix,
                    "' holds quantized tensors but the quantization config keeps it unquantized (",
                    scheme.rule, ")");
      return false;
    case ModuleScheme::Kind::kAny:
      return has;
    default: {
      if (has) return true;
      const CheckpointTensor* w = checkpoint_.find(prefix + ".weight");
      METRALE_CHECK(w != nullptr && w->info->dtype != DType::kF32 &&
                        w->info->dtype != DType::kBF16 && w->info->dtype != DType::kF16,
                    checkpoint_.dir().string(), ": module '", prefix, "': ", scheme.rule,
                    " declares it quantized (", module_kind_name(scheme.kind),
                    ") but the "
                    "checkpoint holds ",
                    w != nullptr ? "a plain " + std::string(dtype_name(w->info->dtype)) + " '" +
                                       prefix + ".weight'"
                                 : "no weight for it");
      return true;
    }
  }
}

void TensorLoader::report(const std::string& module, const std::string& format,
                          const std::string& rule) {
  report_.push_back({module, format, rule});
}

WeightTensor TensorLoader::copy_prepared(WeightTensor w, const float* bias, PrepareMode mode) {
  if (bias != nullptr) {
    w.bias = bias;
    w.bias_dtype = DType::kF32;
  }
  WeightTensor prepared = backend_.prepare(w, mode);
  METRALE_CHECK(prepared.storage != nullptr, "backend ", backend_.name(), " kept no copy of '",
                w.name, "'");
  storage_.push_back(prepared.storage);
  return prepared;
}

void TensorLoader::read_bias(const std::string& name, int64_t n, float* dst) {
  const CheckpointTensor& b = claim(name, {n});
  METRALE_CHECK(b.info->dtype == DType::kF32 || b.info->dtype == DType::kBF16,
                checkpoint_.dir().string(), ": tensor '", name, "' has dtype ",
                dtype_name(b.info->dtype), "; expected f32 or bf16");
  const auto bytes = b.bytes();  // may be unaligned for its element type: copy out first
  std::vector<std::byte> raw(bytes.begin(), bytes.end());
  to_f32(raw.data(), b.info->dtype, dst, static_cast<size_t>(n));
  advance(b.info->nbytes());
}

WeightTensor TensorLoader::quantized_linear(const std::vector<std::string>& prefixes,
                                            const std::vector<int64_t>& n_outs, int64_t n_in,
                                            bool has_bias, const std::string& name) {
  std::vector<QuantizedWeight> parts;
  int64_t n_out = 0;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    const ModuleScheme scheme = scheme_of(prefixes[i]);
    METRALE_CHECK(quantized(prefixes[i], scheme), checkpoint_.dir().string(), ": '", name,
                  "' joins quantized and plain modules ('", prefixes[i],
                  "' is plain); they must be one matrix here");
    parts.push_back(read_quantized(checkpoint_, prefixes[i], scheme, n_outs[i], n_in));
    for (const std::string& t : parts.back().tensors) {
      claimed_.insert(t);
      advance(checkpoint_.find(t)->info->nbytes());
    }
    report(prefixes[i], parts.back().describe() + ", " + parts.back().layout, scheme.rule);
    n_out += n_outs[i];
  }
  const QuantizedWeight q =
      parts.size() == 1 ? std::move(parts[0]) : join_quantized(std::move(parts), name);
  std::vector<float> bias(has_bias ? static_cast<size_t>(n_out) : 0);
  if (has_bias) {
    int64_t row = 0;
    for (size_t i = 0; i < prefixes.size(); ++i) {
      read_bias(prefixes[i] + ".bias", n_outs[i], bias.data() + row);
      row += n_outs[i];
    }
  }
  WeightTensor w{.name = name,
                 .format = q.format,
                 .n_out = n_out,
                 .n_in = n_in,
                 .data = q.codes.data(),
                 .quant = q.params()};
  return copy_prepared(w, has_bias ? bias.data() : nullptr);
}

bool TensorLoader::can_fuse(const std::vector<std::string>& prefixes) const {
  if (!can_fuse()) return false;
  int n_quantized = 0;
  for (const std::string& p : prefixes) n_quantized += quantized(p, scheme_of(p)) ? 1 : 0;
  if (n_quantized == 0) return true;
  if (n_quantized != static_cast<int>(prefixes.size())) return false;
  // Joinable without reading the codes: the same tensors with the same dtypes, the same
  // number of groups, and the same input order.
  auto signature = [&](const std::string& p) {
    std::string sig;
    for (const CheckpointTensor& t : checkpoint_.tensors()) {
      if (!t.name().starts_with(p + ".")) continue;
      const std::string_view leaf = t.name().substr(p.size() + 1);
      if (leaf == "bias" || leaf.starts_with("input_")) continue;
      sig += std::string(leaf) + ":" + std::string(dtype_name(t.info->dtype));
      if (leaf == "weight_scale" && t.info->shape.rank() == 2)
        sig += "/" + std::to_string(t.info->shape[1]);
      if (leaf == "weight_g_idx") {
        const auto b = t.bytes();
        sig += "/" + std::string(reinterpret_cast<const char*>(b.data()), b.size());
      }
      sig += ";";
    }
    std::sort(sig.begin(), sig.end());
    return sig;
  };
  const std::string first = signature(prefixes[0]);
  for (const std::string& p : prefixes)
    if (signature(p) != first) return false;
  return true;
}

void TensorLoader::refuse_quantized(const std::string& weight_name, std::string_view where) const {
  const std::string prefix = weight_name.ends_with(".weight")
                                 ? weight_name.substr(0, weight_name.size() - 7)
                                 : weight_name;
  METRALE_CHECK(!has_quantized_tensors(checkpoint_, prefix), checkpoint_.dir().string(),
                ": module '", prefix, "' is quantized, but ", where,
                " reads plain matrices only in this build");
}

WeightTensor TensorLoader::linear_impl(const std::string& name, const std::string* bias_name,
                                       int64_t n_out, int64_t n_in) {
  if (placement_ == WeightPlacement::kCopy)
    return copy_parts({{name, bias_name, n_out}}, n_in, name);
  const CheckpointTensor& t = claim(name, {n_out, n_in});
  const auto format = weight_format_for_dtype(t.info->dtype);
  METRALE_CHECK(format.has_value(), checkpoint_.dir().string(), ": tensor '", name, "' has dtype ",
                dtype_name(t.info->dtype), "; plain weights must be f32 or bf16");
  backend_.require(Op::kLinear, *format, DType::kF32, name);
  WeightTensor w{.name = name, .format = *format, .n_out = n_out, .n_in = n_in};
  w.data = place(t);
  if (bias_name != nullptr) {
    const CheckpointTensor& b = claim(*bias_name, {n_out});
    METRALE_CHECK(b.info->dtype == DType::kF32 || b.info->dtype == DType::kBF16,
                  checkpoint_.dir().string(), ": tensor '", *bias_name, "' has dtype ",
                  dtype_name(b.info->dtype), "; expected f32 or bf16");
    w.bias = place(b);
    w.bias_dtype = b.info->dtype;
    advance(b.info->nbytes());
  }
  advance(t.info->nbytes());
  WeightTensor prepared = backend_.prepare(w, PrepareMode::kInPlace);
  if (prepared.storage) storage_.push_back(prepared.storage);
  return prepared;
}

WeightTensor TensorLoader::fused_linear(const std::vector<std::string>& prefixes,
                                        const std::vector<int64_t>& n_outs, int64_t n_in,
                                        bool has_bias) {
  METRALE_CHECK(!prefixes.empty() && prefixes.size() == n_outs.size(),
                "fused_linear: one n_out per prefix");
  std::vector<std::string> bias_names;
  bias_names.reserve(prefixes.size());
  std::vector<Part> parts;
  std::string name;
  bool any_quantized = false;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    bias_names.push_back(prefixes[i] + ".bias");
    parts.push_back({prefixes[i] + ".weight", has_bias ? &bias_names.back() : nullptr, n_outs[i]});
    name += (i ? "+" : "") + prefixes[i] + ".weight";
    any_quantized = any_quantized || quantized(prefixes[i], scheme_of(prefixes[i]));
  }
  if (any_quantized) return quantized_linear(prefixes, n_outs, n_in, has_bias, name);
  WeightTensor w = copy_parts(parts, n_in, name);
  for (const std::string& p : prefixes)
    report(p, std::string(weight_format_name(w.format)), scheme_of(p).rule);
  return w;
}

void TensorLoader::claim_joined(const std::string& name, int64_t n_out, int64_t n_in,
                                const std::string& first, std::optional<WeightFormat>& format) {
  refuse_quantized(name, "a matrix joined from several tensors");
  const CheckpointTensor& t = claim(name, {n_out, n_in});
  const auto f = weight_format_for_dtype(t.info->dtype);
  METRALE_CHECK(f.has_value(), checkpoint_.dir().string(), ": tensor '", name, "' has dtype ",
                dtype_name(t.info->dtype), "; plain weights must be f32 or bf16");
  METRALE_CHECK(!format || *format == *f, checkpoint_.dir().string(), ": tensor '", name, "' is ",
                weight_format_name(*f), " but '", first, "' is ", weight_format_name(*format),
                "; matrices joined into one need one format");
  format = f;
  backend_.require(Op::kLinear, *f, DType::kF32, name);
}

WeightTensor TensorLoader::copy_parts(const std::vector<Part>& parts, int64_t n_in,
                                      const std::string& name) {
  std::optional<WeightFormat> format;
  int64_t n_out = 0;
  bool any_bias = false;
  for (const Part& p : parts) {
    claim_joined(p.name, p.n_out, n_in, parts[0].name, format);
    n_out += p.n_out;
    any_bias = any_bias || p.bias_name != nullptr;
  }
  const size_t row_bytes = weight_row_bytes(*format, n_in);
  // Staging: rows in checkpoint layout, released once the backend has its own copy.
  const Buffer& staging = staging_for(row_bytes * static_cast<size_t>(n_out));
  std::vector<float> bias(any_bias ? static_cast<size_t>(n_out) : 0);
  size_t row = 0;
  for (const Part& p : parts) {
    const CheckpointTensor& t = *checkpoint_.find(p.name);
    checkpoint_.copy_to(p.name, {staging.as<std::byte>() + row * row_bytes, t.info->nbytes()});
    advance(t.info->nbytes());
    if (p.bias_name != nullptr) read_bias(*p.bias_name, p.n_out, bias.data() + row);
    row += static_cast<size_t>(p.n_out);
  }
  WeightTensor w{
      .name = name, .format = *format, .n_out = n_out, .n_in = n_in, .data = staging.data()};
  return copy_prepared(w, any_bias ? bias.data() : nullptr);
}

WeightTensor TensorLoader::gathered_matrix(const std::vector<RowGather>& parts, int64_t n_in,
                                           const std::string& name) {
  std::optional<WeightFormat> format;
  int64_t n_out = 0;
  for (const RowGather& p : parts) {
    claim_joined(p.name, p.n_rows, n_in, parts[0].name, format);
    for (const int64_t r : p.rows) {
      METRALE_CHECK(r >= 0 && r < p.n_rows, "gathered_matrix: row ", r, " of '", p.name,
                    "' is outside [0, ", p.n_rows, ")");
    }
    n_out += static_cast<int64_t>(p.rows.size());
  }
  METRALE_CHECK(format.has_value() && n_out > 0, "gathered_matrix '", name, "': no rows");
  const size_t row_bytes = weight_row_bytes(*format, n_in);
  std::vector<std::byte> whole;
  Buffer out = backend_.allocate(row_bytes * static_cast<size_t>(n_out));
  size_t row = 0;
  for (const RowGather& p : parts) {
    const CheckpointTensor& t = *checkpoint_.find(p.name);
    whole.resize(t.info->nbytes());
    checkpoint_.copy_to(p.name, {whole.data(), whole.size()});
    for (const int64_t r : p.rows) {
      std::memcpy(out.as<std::byte>() + row++ * row_bytes,
                  whole.data() + static_cast<size_t>(r) * row_bytes, row_bytes);
    }
    advance(t.info->nbytes());
  }
  WeightTensor w{.name = name, .format = *format, .n_out = n_out, .n_in = n_in, .data = out.data()};
  return copy_prepared(w, nullptr);
}

std::vector<WeightTensor> TensorLoader::stacked_matrices(const std::string& name, int64_t n_stack,
                                                         int64_t n_out, int64_t n_in) {
  const CheckpointTensor& t = claim(name, {n_stack, n_out, n_in});
  const auto format = weight_format_for_dtype(t.info->dtype);
  METRALE_CHECK(format.has_value(), checkpoint_.dir().string(), ": tensor '", name, "' has dtype ",
                dtype_name(t.info->dtype), "; plain weights must be f32 or bf16");
  backend_.require(Op::kLinear, *format, DType::kF32, name);
  const size_t slice_bytes = weight_row_bytes(*format, n_in) * static_cast<size_t>(n_out);
  const bool in_place = placement_ == WeightPlacement::kInPlace && t.file->is_aligned(*t.info);
  const std::span<const std::byte> all = t.bytes();
  std::vector<WeightTensor> out;
  out.reserve(static_cast<size_t>(n_stack));
  for (int64_t i = 0; i < n_stack; ++i) {
    const std::span<const std::byte> slice =
        all.subspan(static_cast<size_t>(i) * slice_bytes, slice_bytes);
    WeightTensor w{.name = name + "[" + std::to_string(i) + "]",
                   .format = *format,
                   .n_out = n_out,
                   .n_in = n_in};
    if (in_place) {
      w.data = slice.data();
      WeightTensor prepared = backend_.prepare(w, PrepareMode::kInPlace);
      if (prepared.storage) storage_.push_back(prepared.storage);
      out.push_back(std::move(prepared));
    } else {
      // Through aligned staging (the mapping may not be aligned for the element type).
      const Buffer& staging = staging_for(slice_bytes);
      std::memcpy(staging.data(), slice.data(), slice_bytes);
      w.data = staging.data();
      WeightTensor prepared = backend_.prepare(w, PrepareMode::kCopy);
      storage_.push_back(prepared.storage);
      out.push_back(std::move(prepared));
    }
    advance(slice_bytes);
  }
  return out;
}

std::vector<WeightTensor> TensorLoader::stacked_matrices_transposed(const std::string& name,
                                                                    int64_t n_stack, int64_t n_out,
                                                                    int64_t n_in) {
  const CheckpointTensor& t = claim(name, {n_stack, n_in, n_out});
  const auto format = weight_format_for_dtype(t.info->dtype);
  METRALE_CHECK(
      format.has_value() && (*format == WeightFormat::kF32 || *format == WeightFormat::kBF16),
      checkpoint_.dir().string(), ": tensor '", name, "' has dtype ", dtype_name(t.info->dtype),
      "; transposed fused experts must be f32 or bf16");
  backend_.require(Op::kLinear, *format, DType::kF32, name);
  const size_t elem = *format == WeightFormat::kF32 ? 4 : 2;
  const size_t slice_bytes = elem * static_cast<size_t>(n_out * n_in);
  const std::span<const std::byte> all = t.bytes();
  std::vector<WeightTensor> out;
  out.reserve(static_cast<size_t>(n_stack));
  for (int64_t i = 0; i < n_stack; ++i) {
    const std::byte* src = all.data() + static_cast<size_t>(i) * slice_bytes;  // [n_in, n_out]
    const Buffer& staging = staging_for(slice_bytes);
    auto* dst = static_cast<std::byte*>(staging.data());  // [n_out, n_in]
    for (int64_t r = 0; r < n_in; ++r) {
      for (int64_t c = 0; c < n_out; ++c) {
        std::memcpy(dst + static_cast<size_t>(c * n_in + r) * elem,
                    src + static_cast<size_t>(r * n_out + c) * elem, elem);
      }
    }
    WeightTensor w{.name = name + "[" + std::to_string(i) + "]",
                   .format = *format,
                   .n_out = n_out,
                   .n_in = n_in,
                   .data = staging.data()};
    WeightTensor prepared = backend_.prepare(w, PrepareMode::kCopy);
    storage_.push_back(prepared.storage);
    out.push_back(std::move(prepared));
    advance(slice_bytes);
  }
  return out;
}

DeviceFloats TensorLoader::norm(const std::string& name, int64_t n) {
  return {backend_, floats(name, {n})};
}

std::vector<float> TensorLoader::floats(const std::string& name,
                                        std::initializer_list<int64_t> shape) {
  const CheckpointTensor& t = claim(name, shape);
  const DType dt = t.info->dtype;
  METRALE_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16,
                checkpoint_.dir().string(), ": tensor '", name, "' has dtype ", dtype_name(dt),
                "; expected f32, bf16 or f16");
  // The mapping may not be aligned for the element type: copy the bytes out first.
  const auto bytes = t.bytes();
  std::vector<std::byte> raw(bytes.begin(), bytes.end());
  std::vector<float> out(static_cast<size_t>(t.info->shape.numel()));
  to_f32(raw.data(), dt, out.data(), out.size());
  advance(t.info->nbytes());
  return out;
}

std::vector<float> TensorLoader::linear_floats(const std::string& prefix, int64_t n_out,
                                               int64_t n_in) {
  const ModuleScheme scheme = scheme_of(prefix);
  const std::string name = prefix + ".weight";
  if (!quantized(prefix, scheme)) {
    std::vector<float> out = floats(name, {n_out, n_in});
    report(prefix, std::string(dtype_name(checkpoint_.find(name)->info->dtype)), scheme.rule);
    return out;
  }
  // A quantized module decodes through the format's reference (dequantize_row): the values
  // the producer's formula gives, as the kernels compute them.
  const QuantizedWeight q = read_quantized(checkpoint_, prefix, scheme, n_out, n_in);
  for (const std::string& t : q.tensors) {
    claimed_.insert(t);
    advance(checkpoint_.find(t)->info->nbytes());
  }
  report(prefix, q.describe() + ", " + q.layout + ", dequantized at load", scheme.rule);
  const QuantParams params = q.params();
  const size_t row_bytes = weight_row_bytes(q.format, n_in);
  std::vector<float> out(static_cast<size_t>(n_out * n_in));
  for (int64_t r = 0; r < n_out; ++r) {
    dequantize_row(q.format, q.codes.data() + static_cast<size_t>(r) * row_bytes, params, r, n_in,
                   out.data() + r * n_in);
  }
  return out;
}

WeightTensor TensorLoader::derived_matrix(const std::string& name, int64_t n_out, int64_t n_in,
                                          std::span<const float> values) {
  METRALE_CHECK(n_out > 0 && n_in > 0 && static_cast<int64_t>(values.size()) == n_out * n_in, name,
                ": expected ", n_out, " x ", n_in, " values, found ", values.size());
  WeightTensor w{.name = name,
                 .format = WeightFormat::kF32,
                 .n_out = n_out,
                 .n_in = n_in,
                 .data = values.data()};
  return copy_prepared(std::move(w), nullptr);
}

WeightTensor TensorLoader::derived_matrix(const std::string& name, int64_t n_out, int64_t n_in,
                                          std::span<const uint16_t> bf16_values) {
  METRALE_CHECK(n_out > 0 && n_in > 0 && static_cast<int64_t>(bf16_values.size()) == n_out * n_in,
                name, ": expected ", n_out, " x ", n_in, " values, found ", bf16_values.size());
  WeightTensor w{.name = name,
                 .format = WeightFormat::kBF16,
                 .n_out = n_out,
                 .n_in = n_in,
                 .data = bf16_values.data()};
  return copy_prepared(std::move(w), nullptr, PrepareMode::kCopyF32Input);
}

void TensorLoader::ignore(const std::string& name) { claimed_.insert(name); }

int64_t TensorLoader::ignore_prefix(std::string_view prefix) {
  int64_t n = 0;
  for (const CheckpointTensor& t : checkpoint_.tensors()) {
    if (!t.name().starts_with(prefix)) continue;
    claimed_.insert(std::string(t.name()));
    ++n;
  }
  return n;
}

void TensorLoader::check_all_claimed() const {
  std::string unexpected;
  int count = 0;
  for (const CheckpointTensor& t : checkpoint_.tensors()) {
    if (claimed_.count(t.name()) != 0) continue;
    if (count < 5) unexpected += (count ? ", '" : "'") + std::string(t.name()) + "'";
    ++count;
  }
  METRALE_CHECK(count == 0, checkpoint_.dir().string(), ": ", count,
                " tensor(s) the config does not account for: ", unexpected,
                count > 5 ? ", ..." : "", " (does config.json match these weights?)");
}

}  // namespace metrale
