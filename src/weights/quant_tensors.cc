#include "weights/quant_tensors.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace metrale {
namespace {

using Kind = ModuleScheme::Kind;

struct Module {
  const Checkpoint& ckpt;
  const std::string& prefix;

  const CheckpointTensor* find(const char* suffix) const { return ckpt.find(prefix + suffix); }
  std::string where(const CheckpointTensor& t) const {
    return ckpt.dir().string() + ": tensor '" + std::string(t.name()) + "'";
  }
  std::vector<uint8_t> bytes(const CheckpointTensor& t) const {
    std::vector<uint8_t> out(t.info->nbytes());
    ckpt.copy_to(t.name(), {reinterpret_cast<std::byte*>(out.data()), out.size()});
    return out;
  }
  // The single value of a [] / [1] float tensor.
  float scalar(const CheckpointTensor& t) const {
    METRALE_CHECK(t.info->shape.numel() == 1, where(t), " has shape ", t.info->shape.str(),
                  ", expected one value ([] or [1])");
    const DType d = t.info->dtype;
    METRALE_CHECK(d == DType::kF32 || d == DType::kBF16 || d == DType::kF16, where(t),
                  " has dtype ", dtype_name(d), ", expected f32, bf16 or f16");
    const std::vector<uint8_t> raw = bytes(t);
    float v = 0.0f;
    to_f32(raw.data(), d, &v, 1);
    METRALE_CHECK(std::isfinite(v) && v > 0.0f, where(t), " is ", v,
                  "; a scale must be finite and > 0");
    return v;
  }
};

bool shape_is(const CheckpointTensor& t, std::initializer_list<int64_t> dims) {
  return t.info->shape == Shape(dims);
}

// Rows of a [src_rows, cols] grid of `es`-byte elements repeated so row n of the result is
// source row n / row_block: [n_out, cols].
std::vector<uint8_t> expand_rows(const std::vector<uint8_t>& src, size_t es, int64_t cols,
                                 int64_t row_block, int64_t n_out) {
  std::vector<uint8_t> out(static_cast<size_t>(n_out * cols) * es);
  const size_t row_bytes = static_cast<size_t>(cols) * es;
  for (int64_t n = 0; n < n_out; ++n)
    std::memcpy(out.data() + static_cast<size_t>(n) * row_bytes,
                src.data() + static_cast<size_t>(n / row_block) * row_bytes, row_bytes);
  return out;
}

void check_scale_dtype(const Module& m, const CheckpointTensor& t, bool e4m3) {
  const DType d = t.info->dtype;
  const bool ok =
      e4m3 ? d == DType::kF8E4M3 : d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
  METRALE_CHECK(ok, m.where(t), " has dtype ", dtype_name(d), ", expected ",
                e4m3 ? "f8_e4m3" : "f32, bf16 or f16");
}

// Sets q.scales / group / n_groups from a scale tensor shaped [N, G] (groups along K),
// [N, 1] / [N] (channel), [] / [1] (tensor) or [ceil(N/bn), ceil(K/bk)] (blocks).
void read_scale_grid(const Module& m, const CheckpointTensor& s, const ModuleScheme& scheme,
                     QuantizedWeight& q, std::string& grid) {
  const int64_t N = q.n_out, K = q.n_in;
  const Shape& sh = s.info->shape;
  const size_t es = static_cast<size_t>(dtype_bits(s.info->dtype) / 8);
  std::vector<uint8_t> raw = m.bytes(s);
  q.scale_dtype = s.info->dtype;
  const bool block_declared = !scheme.block.empty();
  const int64_t bn = block_declared ? scheme.block[0] : 128;
  const int64_t bk = block_declared ? scheme.block[1] : 128;
  const int64_t block_rows = (N + bn - 1) / bn, block_cols = (K + bk - 1) / bk;
  if (sh.numel() == 1 && (sh.rank() == 0 || sh.rank() == 1)) {
    q.group = K;
    q.n_groups = 1;
    q.scales = expand_rows(raw, es, 1, N, N);
    grid = "tensor";
  } else if ((sh.rank() == 2 && sh[0] == N && sh[1] == 1) || (sh.rank() == 1 && sh[0] == N)) {
    q.group = K;
    q.n_groups = 1;
    q.scales = std::move(raw);
    grid = "channel";
  } else if (sh.rank() == 2 &&
             (scheme.strategy == "block" || !scheme.block.empty() ||
              (scheme.strategy.empty() && sh[0] != N)) &&
             sh[0] == block_rows && sh[1] == block_cols) {
    q.group = std::min(bk, K);  // a block wider than the matrix: one group of all K inputs
    q.n_groups = block_cols;
    q.scales = expand_rows(raw, es, block_cols, bn, N);
    grid = "block " + std::to_string(bn) + "x" + std::to_string(bk);
  } else if (sh.rank() == 2 && sh[0] == N && sh[1] > 1) {
    const int64_t G = sh[1];
    METRALE_CHECK(scheme.group_size > 0 || K % G == 0, m.where(s), ": ", K,
                  " inputs do not split into ", G,
                  " equal groups and the config states no "
                  "group_size");
    const int64_t group = scheme.group_size > 0 ? scheme.group_size : K / G;
    METRALE_CHECK((K + group - 1) / group == G, m.where(s), " has ", G, " groups per row; ", K,
                  " inputs in groups of ", group, " make ", (K + group - 1) / group);
    q.group = group;
    q.n_groups = G;
    q.scales = std::move(raw);
    grid = "group " + std::to_string(group);
  } else {
    throw make_error(m.where(s), " has shape ", sh.str(), "; for a weight [", N, ", ", K,
                     "] expected [", N, ", groups], [", N, ", 1], [] or [", block_rows, ", ",
                     block_cols, "] (", bn, "x", bk, " blocks)");
  }
}

// Integer codes packed LSB first into int32 words, each stored + 2^(bits-1): rows of
// `words_per_row` words -> our codes (int4: the bytes as they are; int8: signed bytes).
void unpack_int_codes(const Module& m, const CheckpointTensor& t, int bits, QuantizedWeight& q) {
  const int64_t per_word = 32 / bits;
  const int64_t words = (q.n_in + per_word - 1) / per_word;
  METRALE_CHECK(shape_is(t, {q.n_out, words}), m.where(t), " has shape ", t.info->shape.str(),
                ", expected [", q.n_out, ", ", words, "] (", q.n_in, " ", bits,
                "-bit values per row, ", per_word, " per int32)");
  const std::vector<uint8_t> raw = m.bytes(t);
  const size_t row_bytes = weight_row_bytes(q.format, q.n_in);
  q.codes.resize(row_bytes * static_cast<size_t>(q.n_out));
  for (int64_t n = 0; n < q.n_out; ++n) {
    const uint8_t* src = raw.data() + static_cast<size_t>(n * words) * 4;  // little-endian words
    uint8_t* dst = q.codes.data() + static_cast<size_t>(n) * row_bytes;
    if (bits == 4) {
      std::memcpy(dst, src, row_bytes);
    } else {
      for (size_t i = 0; i < row_bytes; ++i) dst[i] = src[i] ^ 0x80u;  // u - 128 as int8
    }
  }
}

// Zero points: [ceil(N * bits / 32), G] int32 packed along N (compressed-tensors), or
// unpacked [N, G] integers. Values are signed, in the code range.
void read_zero_points(const Module& m, const CheckpointTensor& t, int bits, QuantizedWeight& q) {
  const int64_t per_word = 32 / bits;
  const int64_t N = q.n_out, G = q.n_groups;
  const Shape& sh = t.info->shape;
  const std::vector<uint8_t> raw = m.bytes(t);
  q.zeros.resize(static_cast<size_t>(N * G));
  const int lo = -(1 << (bits - 1)), hi = (1 << (bits - 1)) - 1;
  if (t.info->dtype == DType::kI32 && shape_is(t, {(N + per_word - 1) / per_word, G})) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < G; ++g) {
        uint32_t word;
        std::memcpy(&word, raw.data() + static_cast<size_t>((n / per_word) * G + g) * 4, 4);
        const auto u = static_cast<int>((word >> (bits * (n % per_word))) & ((1u << bits) - 1));
        q.zeros[static_cast<size_t>(n * G + g)] = static_cast<int8_t>(u - (1 << (bits - 1)));
      }
    }
    return;
  }
  METRALE_CHECK(sh.rank() == 2 && sh[0] == N && sh[1] == G &&
                    (t.info->dtype == DType::kI8 || t.info->dtype == DType::kI32),
                m.where(t), " has shape ", sh.str(), " and dtype ", dtype_name(t.info->dtype),
                "; expected int32 [", (N + per_word - 1) / per_word, ", ", G,
                "] (packed along the outputs) or int8 / int32 [", N, ", ", G, "]");
  std::vector<float> v(static_cast<size_t>(N * G));
  to_f32(raw.data(), t.info->dtype, v.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    METRALE_CHECK(v[i] >= static_cast<float>(lo) && v[i] <= static_cast<float>(hi), m.where(t),
                  ": zero point ", v[i], " is outside [", lo, ", ", hi, "]");
    q.zeros[i] = static_cast<int8_t>(v[i]);
  }
}

void check_fp8_codes(const Module& m, const CheckpointTensor& t, const QuantizedWeight& q) {
  for (size_t i = 0; i < q.codes.size(); ++i) {
    METRALE_CHECK((q.codes[i] & 0x7Fu) != 0x7Fu, m.where(t), " holds a NaN code (0x", std::hex,
                  static_cast<int>(q.codes[i]), std::dec, ") at row ",
                  static_cast<int64_t>(i) / q.n_in, " column ", static_cast<int64_t>(i) % q.n_in);
  }
}

void check_against_scheme(const Module& m, const ModuleScheme& s, const QuantizedWeight& q,
                          const std::string& grid) {
  if (s.kind == Kind::kAny) return;
  const Kind found = q.format == WeightFormat::kFp8     ? Kind::kFloat8
                     : q.format == WeightFormat::kNvfp4 ? Kind::kNvfp4
                                                        : Kind::kInt;
  const int bits = q.format == WeightFormat::kInt8 || q.format == WeightFormat::kFp8 ? 8 : 4;
  METRALE_CHECK(found == s.kind && (s.bits == 0 || s.bits == bits), m.ckpt.dir().string(),
                ": module '", m.prefix, "' holds ", q.describe(), " (", q.layout, ") but ", s.rule,
                " declares ", module_kind_name(s.kind), " with ", s.bits, " bits");
  if (s.kind == Kind::kInt) {
    METRALE_CHECK(s.symmetric == q.zeros.empty(), m.ckpt.dir().string(), ": module '", m.prefix,
                  "' is ", q.zeros.empty() ? "symmetric (no weight_zero_point)" : "asymmetric",
                  " but ", s.rule, " declares symmetric: ", s.symmetric ? "true" : "false");
    METRALE_CHECK(!s.actorder || !q.g_idx.empty(), m.ckpt.dir().string(), ": module '", m.prefix,
                  "': ", s.rule, " declares actorder but there is no '", m.prefix,
                  ".weight_g_idx'");
  }
  if (s.strategy == "group" && grid.starts_with("group")) {
    METRALE_CHECK(q.group == s.group_size, m.ckpt.dir().string(), ": module '", m.prefix,
                  "' has groups of ", q.group, " but ", s.rule, " declares group_size ",
                  s.group_size);
  }
  if (s.strategy == "channel") {
    METRALE_CHECK(grid == "channel", m.ckpt.dir().string(), ": module '", m.prefix, "' has ", grid,
                  " scales but ", s.rule, " declares channel scales");
  }
}

}  // namespace

QuantParams QuantizedWeight::params() const {
  QuantParams p;
  p.scales = scales.data();
  p.scale_dtype = scale_dtype;
  p.scale_global = scale_global;
  p.group = group;
  p.n_groups = n_groups;
  p.zeros = zeros.empty() ? nullptr : zeros.data();
  p.g_idx = g_idx.empty() ? nullptr : g_idx.data();
  return p;
}

std::string QuantizedWeight::describe() const {
  std::ostringstream os;
  os << weight_format_name(format) << " " << grid;
  if (!zeros.empty()) os << " asym";
  if (!g_idx.empty()) os << " actorder";
  os << " (" << dtype_name(scale_dtype) << " scales";
  if (scale_global != 1.0f) os << " x global";
  os << ")";
  return os.str();
}

bool has_quantized_tensors(const Checkpoint& c, const std::string& prefix) {
  for (const char* s : {".weight_packed", ".weight_scale", ".weight_scale_inv", ".weight_scale_2"})
    if (c.find(prefix + s) != nullptr) return true;
  return false;
}

QuantizedWeight read_quantized(const Checkpoint& ckpt, const std::string& prefix,
                               const ModuleScheme& scheme, int64_t n_out, int64_t n_in) {
  const Module m{ckpt, prefix};
  QuantizedWeight q;
  q.n_out = n_out;
  q.n_in = n_in;
  const CheckpointTensor* packed = m.find(".weight_packed");
  const CheckpointTensor* weight = m.find(".weight");
  const CheckpointTensor* scale = m.find(".weight_scale");
  const CheckpointTensor* scale_inv = m.find(".weight_scale_inv");
  const CheckpointTensor* scale_2 = m.find(".weight_scale_2");
  const CheckpointTensor* global = m.find(".weight_global_scale");
  const CheckpointTensor* zero = m.find(".weight_zero_point");
  const CheckpointTensor* g_idx = m.find(".weight_g_idx");
  const CheckpointTensor* wshape = m.find(".weight_shape");
  auto claim = [&](const CheckpointTensor* t) {
    if (t != nullptr) q.tensors.emplace_back(t->name());
  };
  for (const char* s : {".input_scale", ".input_global_scale", ".input_zero_point"})
    claim(m.find(s));
  std::string grid;
  auto need_scale = [&](const char* what) -> const CheckpointTensor& {
    METRALE_CHECK(scale != nullptr, ckpt.dir().string(), ": module '", prefix, "' (", what,
                  ") has no '", prefix, ".weight_scale'");
    claim(scale);
    return *scale;
  };

  // The tensor holding the codes, one row of `cols` per output: claimed, checked, read.
  auto take_codes = [&](const CheckpointTensor& t, WeightFormat f, const char* layout,
                        int64_t cols) {
    claim(&t);
    q.format = f;
    q.layout = layout;
    METRALE_CHECK(shape_is(t, {n_out, cols}), m.where(t), " has shape ", t.info->shape.str(),
                  ", expected [", n_out, ", ", cols, "]");
    q.codes = m.bytes(t);
  };
  auto take_nvfp4_codes = [&](const CheckpointTensor& t, const char* layout) {
    METRALE_CHECK(n_in % 16 == 0, m.where(t), ": ", n_in,
                  " inputs per row is not a multiple of NVFP4's group of 16");
    take_codes(t, WeightFormat::kNvfp4, layout, n_in / 2);
  };

  if (packed != nullptr && packed->info->dtype == DType::kI32) {
    // compressed-tensors pack-quantized int4 / int8.
    claim(packed);
    const int64_t words = packed->info->shape.rank() == 2 ? packed->info->shape[1] : 0;
    const int bits = scheme.kind == Kind::kInt ? scheme.bits
                     : words == (n_in + 7) / 8 ? 4
                     : words == (n_in + 3) / 4 ? 8
                                               : 0;
    METRALE_CHECK(bits == 4 || bits == 8, m.where(*packed), " has shape ",
                  packed->info->shape.str(), ": ", n_in, " inputs per row make ", (n_in + 7) / 8,
                  " words of 4-bit or ", (n_in + 3) / 4, " of 8-bit values");
    q.format = bits == 4 ? WeightFormat::kInt4 : WeightFormat::kInt8;
    METRALE_CHECK(n_in % 2 == 0, m.where(*packed), ": ", n_in, " inputs per row is odd");
    q.layout = "compressed-tensors pack-quantized";
    if (wshape != nullptr) {
      claim(wshape);
      METRALE_CHECK(wshape->info->shape.numel() == 2 &&
                        (wshape->info->dtype == DType::kI64 || wshape->info->dtype == DType::kI32),
                    m.where(*wshape), " must be 2 integers");
      std::vector<float> v(2);
      const std::vector<uint8_t> raw = m.bytes(*wshape);
      to_f32(raw.data(), wshape->info->dtype, v.data(), 2);
      METRALE_CHECK(v[0] == static_cast<float>(n_out) && v[1] == static_cast<float>(n_in),
                    m.where(*wshape), " is [", v[0], ", ", v[1], "], expected [", n_out, ", ", n_in,
                    "] from config.json");
    }
    unpack_int_codes(m, *packed, bits, q);
    const CheckpointTensor& s = need_scale("pack-quantized");
    check_scale_dtype(m, s, false);
    read_scale_grid(m, s, scheme, q, grid);
    if (zero != nullptr) {
      claim(zero);
      read_zero_points(m, *zero, bits, q);
    }
  } else if (packed != nullptr && packed->info->dtype == DType::kU8) {
    take_nvfp4_codes(*packed, "compressed-tensors nvfp4-pack-quantized");
    METRALE_CHECK(global != nullptr, ckpt.dir().string(), ": module '", prefix,
                  "' (nvfp4) has no '", prefix, ".weight_global_scale'");
    claim(global);
    q.scale_global = 1.0f / m.scalar(*global);
    const CheckpointTensor& s = need_scale("nvfp4");
    check_scale_dtype(m, s, true);
  } else if (weight != nullptr && weight->info->dtype == DType::kU8 && scale_2 != nullptr) {
    take_nvfp4_codes(*weight, "ModelOpt NVFP4");
    claim(scale_2);
    q.scale_global = m.scalar(*scale_2);
    const CheckpointTensor& s = need_scale("nvfp4");
    check_scale_dtype(m, s, true);
  } else if (weight != nullptr && weight->info->dtype == DType::kF8E4M3) {
    take_codes(*weight, WeightFormat::kFp8, "float8 scaled", n_in);
    check_fp8_codes(m, *weight, q);
    const CheckpointTensor* s = scale_inv != nullptr ? scale_inv : scale;
    METRALE_CHECK(s != nullptr, ckpt.dir().string(), ": module '", prefix,
                  "' has float8 weights but neither '", prefix, ".weight_scale' nor '", prefix,
                  ".weight_scale_inv'");
    claim(s);
    if (scale_inv != nullptr) q.layout = "fp8 block-scaled (weight_scale_inv)";
    check_scale_dtype(m, *s, false);
    read_scale_grid(m, *s, scheme, q, grid);
  } else if (weight != nullptr && weight->info->dtype == DType::kI8 && scale != nullptr) {
    take_codes(*weight, WeightFormat::kInt8, "compressed-tensors int-quantized", n_in);
    const CheckpointTensor& s = need_scale("int-quantized");
    check_scale_dtype(m, s, false);
    read_scale_grid(m, s, scheme, q, grid);
    if (zero != nullptr) {
      claim(zero);
      read_zero_points(m, *zero, 8, q);
    }
  } else {
    std::string found;
    for (const CheckpointTensor& t : ckpt.tensors()) {
      if (t.name().starts_with(prefix + ".")) {
        found += (found.empty() ? "" : ", ") + std::string(t.name()) + " " +
                 std::string(dtype_name(t.info->dtype)) + " " + t.info->shape.str();
      }
    }
    throw make_error(ckpt.dir().string(), ": module '", prefix,
                     "' is not in a quantized layout this build reads (found: ",
                     found.empty() ? "nothing" : found, ")");
  }
  if (q.format == WeightFormat::kNvfp4) {
    // Scales: e4m3, one per 16 values.
    const CheckpointTensor& s = *scale;
    METRALE_CHECK(shape_is(s, {n_out, n_in / 16}), m.where(s), " has shape ", s.info->shape.str(),
                  ", expected [", n_out, ", ", n_in / 16, "] (one per 16 values)");
    q.scales = m.bytes(s);
    q.scale_dtype = DType::kF8E4M3;
    q.group = 16;
    q.n_groups = n_in / 16;
    grid = "group 16";
  }
  if (g_idx != nullptr) {
    claim(g_idx);
    METRALE_CHECK(q.format == WeightFormat::kInt4 || q.format == WeightFormat::kInt8,
                  m.where(*g_idx), ": an input order only exists for integer weights");
    METRALE_CHECK(shape_is(*g_idx, {n_in}) &&
                      (g_idx->info->dtype == DType::kI32 || g_idx->info->dtype == DType::kI64),
                  m.where(*g_idx), " has shape ", g_idx->info->shape.str(), " and dtype ",
                  dtype_name(g_idx->info->dtype), ", expected int32 / int64 [", n_in, "]");
    const std::vector<uint8_t> raw = m.bytes(*g_idx);
    q.g_idx.resize(static_cast<size_t>(n_in));
    for (int64_t k = 0; k < n_in; ++k) {
      int64_t v;
      if (g_idx->info->dtype == DType::kI32) {
        int32_t v32;
        std::memcpy(&v32, raw.data() + k * 4, 4);
        v = v32;
      } else {
        std::memcpy(&v, raw.data() + k * 8, 8);
      }
      METRALE_CHECK(v >= 0 && v < q.n_groups, m.where(*g_idx), ": g_idx[", k, "] = ", v,
                    " is outside [0, ", q.n_groups, ")");
      q.g_idx[static_cast<size_t>(k)] = static_cast<int32_t>(v);
    }
  }
  // Every remaining parameter tensor of the module must be one we read.
  for (const CheckpointTensor& t : ckpt.tensors()) {
    const std::string_view name = t.name();
    if (!name.starts_with(prefix + ".")) continue;
    const std::string_view leaf = name.substr(prefix.size() + 1);
    if (leaf.find('.') != std::string_view::npos || leaf == "bias") continue;
    bool known = false;
    for (const std::string& c : q.tensors) known = known || c == name;
    METRALE_CHECK(known, ckpt.dir().string(), ": module '", prefix, "' (", q.layout,
                  ") has a tensor this layout does not define: '", name, "'");
  }
  q.grid = grid;
  validate_quant_params(q.format, q.params(), n_out, n_in, prefix);
  check_against_scheme(m, scheme, q, grid);
  return q;
}

bool can_join(const std::vector<const QuantizedWeight*>& parts) {
  for (const QuantizedWeight* p : parts) {
    if (p->format != parts[0]->format || p->group != parts[0]->group ||
        p->n_groups != parts[0]->n_groups || p->n_in != parts[0]->n_in ||
        p->g_idx != parts[0]->g_idx)
      return false;
  }
  return true;
}

QuantizedWeight join_quantized(std::vector<QuantizedWeight> parts, const std::string& name) {
  std::vector<const QuantizedWeight*> ptrs;
  for (const QuantizedWeight& p : parts) ptrs.push_back(&p);
  METRALE_CHECK(!parts.empty() && can_join(ptrs), "quantized weight '", name,
                "': its parts differ in format, groups or input order and cannot be one matrix");
  bool same_scales = true, any_zeros = false;
  for (const QuantizedWeight& p : parts) {
    same_scales = same_scales && p.scale_dtype == parts[0].scale_dtype &&
                  p.scale_global == parts[0].scale_global;
    any_zeros = any_zeros || !p.zeros.empty();
  }
  QuantizedWeight out;
  out.format = parts[0].format;
  out.n_in = parts[0].n_in;
  out.group = parts[0].group;
  out.n_groups = parts[0].n_groups;
  out.g_idx = parts[0].g_idx;
  out.layout = parts[0].layout;
  out.grid = parts[0].grid;
  out.scale_dtype = same_scales ? parts[0].scale_dtype : DType::kF32;
  out.scale_global = same_scales ? parts[0].scale_global : 1.0f;
  for (QuantizedWeight& p : parts) {
    out.n_out += p.n_out;
    out.codes.insert(out.codes.end(), p.codes.begin(), p.codes.end());
    if (same_scales) {
      out.scales.insert(out.scales.end(), p.scales.begin(), p.scales.end());
    } else {
      // Widen to f32 with the part's global folded in: the same f32 product the kernel forms.
      const QuantParams qp = p.params();
      for (int64_t n = 0; n < p.n_out; ++n) {
        for (int64_t g = 0; g < p.n_groups; ++g) {
          const float s = quant_scale(qp, n, g);
          const auto* b = reinterpret_cast<const uint8_t*>(&s);
          out.scales.insert(out.scales.end(), b, b + sizeof s);
        }
      }
    }
    if (any_zeros) {
      if (p.zeros.empty()) p.zeros.assign(static_cast<size_t>(p.n_out * p.n_groups), 0);
      out.zeros.insert(out.zeros.end(), p.zeros.begin(), p.zeros.end());
    }
    out.tensors.insert(out.tensors.end(), p.tensors.begin(), p.tensors.end());
  }
  return out;
}

}  // namespace metrale
