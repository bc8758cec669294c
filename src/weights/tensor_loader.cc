#include "weights/tensor_loader.h"

#include <cstring>
#include <optional>

#include "core/error.h"
#include "quant/weight_format.h"

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
  const std::string bias_name = prefix + ".bias";
  if (!has_bias) return linear_impl(prefix + ".weight", nullptr, n_out, n_in);
  return linear_impl(prefix + ".weight", &bias_name, n_out, n_in);
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
  for (size_t i = 0; i < prefixes.size(); ++i) {
    bias_names.push_back(prefixes[i] + ".bias");
    parts.push_back({prefixes[i] + ".weight", has_bias ? &bias_names.back() : nullptr, n_outs[i]});
    name += (i ? "+" : "") + prefixes[i] + ".weight";
  }
  return copy_parts(parts, n_in, name);
}

void TensorLoader::claim_joined(const std::string& name, int64_t n_out, int64_t n_in,
                                const std::string& first, std::optional<WeightFormat>& format) {
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
    if (p.bias_name != nullptr) {
      const CheckpointTensor& b = claim(*p.bias_name, {p.n_out});
      METRALE_CHECK(b.info->dtype == DType::kF32 || b.info->dtype == DType::kBF16,
                    checkpoint_.dir().string(), ": tensor '", *p.bias_name, "' has dtype ",
                    dtype_name(b.info->dtype), "; expected f32 or bf16");
      const auto bytes = b.bytes();  // may be unaligned for its element type: copy out first
      std::vector<std::byte> raw(bytes.begin(), bytes.end());
      to_f32(raw.data(), b.info->dtype, bias.data() + row, static_cast<size_t>(p.n_out));
      advance(b.info->nbytes());
    }
    row += static_cast<size_t>(p.n_out);
  }
  WeightTensor w{
      .name = name, .format = *format, .n_out = n_out, .n_in = n_in, .data = staging.data()};
  if (any_bias) {
    w.bias = bias.data();
    w.bias_dtype = DType::kF32;
  }
  WeightTensor prepared = backend_.prepare(w, PrepareMode::kCopy);
  METRALE_CHECK(prepared.storage != nullptr, "backend ", backend_.name(), " kept no copy of '",
                name, "'");
  storage_.push_back(prepared.storage);
  return prepared;
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
  WeightTensor prepared = backend_.prepare(w, PrepareMode::kCopy);
  METRALE_CHECK(prepared.storage != nullptr, "backend ", backend_.name(), " kept no copy of '",
                name, "'");
  storage_.push_back(prepared.storage);
  return prepared;
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

NormWeight TensorLoader::norm(const std::string& name, int64_t n) { return floats(name, {n}); }

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
