#pragma once
// TensorLoader: the shared mechanics of every weight map. It looks tensors up by their
// safetensors key, checks dtype and shape against what the config implies (errors name the
// tensor, the expected and the found), hands linear weights to the backend in the placement
// asked for, and remembers which tensors were claimed so a map can insist that the
// checkpoint holds nothing it does not understand.
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors/checkpoint.h"
#include "quant/quant_config.h"

namespace metrale {

// Where decode reads weights from (docs/performance.md: a measured choice; `metrale bench` reports
// both). kCopy streams each tensor into backend memory and releases the mapped pages as it
// goes, so a load never holds two resident copies.
enum class WeightPlacement : uint8_t { kCopy, kInPlace };

class TensorLoader {
 public:
  TensorLoader(const Checkpoint& checkpoint, Backend& backend, WeightPlacement placement,
               void (*progress)(uint64_t done, uint64_t total));

  // The checkpoint's declared quantization (not owned; null or a config with no dialect:
  // tensor names decide per module). Set before the first linear.
  void set_quant_config(const QuantConfig* config) { quant_ = config; }
  // One line per linear module loaded: its format as loaded and the rule that decided it
  // (for `metrale inspect`).
  struct ModuleReport {
    std::string module;  // "model.layers.0.self_attn.q_proj"
    std::string format;  // "int4 g128 asym (bf16 scales)", "bf16"
    std::string rule;    // "config_groups.group_0 target 'Linear'", "ignore 'lm_head'"
  };
  const std::vector<ModuleReport>& module_report() const { return report_; }

  // A [n_out, n_in] matrix in a plain weight format (f32, bf16), prepared by the backend.
  WeightTensor matrix(const std::string& name, int64_t n_out, int64_t n_in);
  // `prefix`.weight [n_out, n_in], plus `prefix`.bias [n_out] when has_bias. A quantized
  // module (declared by the config, or holding a quantized layout's tensors) is read in its
  // producer's layout (weights/quant_tensors.h) and always copied into backend memory.
  WeightTensor linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool has_bias);
  // Several linears sharing n_in concatenated along n_out into one matrix (q/k/v, gate/up),
  // so one pass over the weights serves them all; each prefix's .weight (and .bias when
  // has_bias) is checked as linear() would. Always a copy into backend memory; layers ask
  // can_fuse() first where reading in place is an option.
  WeightTensor fused_linear(const std::vector<std::string>& prefixes,
                            const std::vector<int64_t>& n_outs, int64_t n_in, bool has_bias);
  bool can_fuse() const { return placement_ == WeightPlacement::kCopy; }
  // Whether these modules can be one matrix: copies are made, and either none is quantized
  // or all are, with parameters that join (same format, groups and input order).
  bool can_fuse(const std::vector<std::string>& prefixes) const;
  // One matrix whose rows are gathered from checkpoint matrices, for checkpoints that
  // interleave what a layer keeps as blocks (Qwen3-Next's in_proj_qkvz, grouped per key head;
  // a gated q_proj's per-head [query | gate]). Output rows are, part by part, rows
  // `rows[i]` of the part's tensor `name` ([n_rows, n_in], claimed whole). Always a copy.
  struct RowGather {
    std::string name;
    int64_t n_rows = 0;
    std::vector<int64_t> rows;
  };
  WeightTensor gathered_matrix(const std::vector<RowGather>& parts, int64_t n_in,
                               const std::string& name);
  // A 3-D tensor [n_stack, n_out, n_in] (e.g. transformers 5's fused experts) as n_stack
  // matrices, slice i named "name[i]"; copied, or read in place when asked and aligned.
  std::vector<WeightTensor> stacked_matrices(const std::string& name, int64_t n_stack,
                                             int64_t n_out, int64_t n_in);
  // The same for a stack of transposed matrices, [n_stack, n_in, n_out] (Qwen3-VL-MoE's
  // published fused experts): each slice transposed into a [n_out, n_in] copy of its dtype.
  std::vector<WeightTensor> stacked_matrices_transposed(const std::string& name, int64_t n_stack,
                                                        int64_t n_out, int64_t n_in);
  // `prefix`.weight [n_out, n_in] widened to f32 rows in host memory, for a layer that derives
  // its own matrices from it (MLA absorbs kv_b_proj into per-head query and value matrices).
  // Plain f32 / bf16 / f16 weights, or a quantized module decoded by its format's reference.
  std::vector<float> linear_floats(const std::string& prefix, int64_t n_out, int64_t n_in);
  // A [n_out, n_in] f32 matrix a layer computed at load (`values` row-major), copied into
  // backend memory and prepared; `name` says where it came from, for messages.
  WeightTensor derived_matrix(const std::string& name, int64_t n_out, int64_t n_in,
                              std::span<const float> values);
  // The same for bf16 values (a layer rearranging a bf16 checkpoint's matrix: no rounding),
  // read at half the bytes; prepared with PrepareMode::kCopyF32Input, so its inputs stay f32
  // under every Compute (exact products, summed in f32 as the f32 path sums).
  WeightTensor derived_matrix(const std::string& name, int64_t n_out, int64_t n_in,
                              std::span<const uint16_t> bf16_values);
  // Whether the checkpoint holds `name` (claims nothing).
  bool has(const std::string& name) const { return checkpoint_.find(name) != nullptr; }
  const Checkpoint& checkpoint() const { return checkpoint_; }
  // A 1-D [n] vector (norm weight), widened to f32, in backend memory (tiny, read every row).
  DeviceFloats norm(const std::string& name, int64_t n);
  // floats() of `name`, in backend memory.
  DeviceFloats device_floats(const std::string& name, std::initializer_list<int64_t> shape) {
    return {backend_, floats(name, shape)};
  }
  // The backend weights are placed on (for arrays a layer derives at load, e.g. a transposed
  // conv kernel, uploaded with DeviceFloats).
  Backend& backend() { return backend_; }
  // Any f32 / bf16 / f16 tensor of exactly `shape`, widened to f32 in its row-major order
  // (small per-layer parameters: a conv kernel, A_log, dt_bias).
  std::vector<float> floats(const std::string& name, std::initializer_list<int64_t> shape);
  // The raw tensor `name` of exactly `shape`, claimed (for weights read by a layer directly).
  const CheckpointTensor& claim(const std::string& name, std::initializer_list<int64_t> shape);
  // Marks `name` as understood but unused (absent is fine too).
  void ignore(const std::string& name);
  // Marks every tensor whose name starts with `prefix` as understood but unused; returns how
  // many there were.
  int64_t ignore_prefix(std::string_view prefix);
  // Throws an Error listing (up to a few) checkpoint tensors no field claimed.
  void check_all_claimed() const;
  std::vector<std::shared_ptr<const Buffer>> take_storage() { return std::move(storage_); }

 private:
  // The declared scheme of module `prefix`, and whether it is loaded quantized (the config
  // says so, or there is no config and its tensors are a quantized layout). A config that
  // contradicts the tensors throws naming both.
  ModuleScheme scheme_of(const std::string& prefix) const;
  bool quantized(const std::string& prefix, const ModuleScheme& scheme) const;
  // Reads, joins and prepares quantized modules (one, or the parts of a fused matrix).
  WeightTensor quantized_linear(const std::vector<std::string>& prefixes,
                                const std::vector<int64_t>& n_outs, int64_t n_in, bool has_bias,
                                const std::string& name);
  // prepare(kCopy) of `w` (with an f32 bias when given); the backend's copy is kept alive by
  // this loader's storage, so the caller may reuse w's memory.
  WeightTensor copy_prepared(WeightTensor w, const float* bias,
                             PrepareMode mode = PrepareMode::kCopy);
  // `name` [n] (f32 or bf16) widened into dst.
  void read_bias(const std::string& name, int64_t n, float* dst);
  void report(const std::string& module, const std::string& format, const std::string& rule);
  // Refuses a quantized module where only plain matrices can be read (a joined or stacked
  // layout), naming it.
  void refuse_quantized(const std::string& weight_name, std::string_view where) const;
  WeightTensor linear_impl(const std::string& name, const std::string* bias_name, int64_t n_out,
                           int64_t n_in);
  struct Part {
    std::string name;
    const std::string* bias_name;  // null: no bias
    int64_t n_out;
  };
  // Copies the parts (rows concatenated) into a staging buffer, then lets the backend copy
  // and repack them into its own memory; the staging buffer is reused by the next tensor.
  WeightTensor copy_parts(const std::vector<Part>& parts, int64_t n_in, const std::string& name);
  const void* place(const CheckpointTensor& t);
  // Claims `name` [n_out, n_in] for a matrix joined from several tensors: a plain format the
  // backend's linear supports, the same as `format` (the first part's, named `first`) when set.
  void claim_joined(const std::string& name, int64_t n_out, int64_t n_in, const std::string& first,
                    std::optional<WeightFormat>& format);
  // Scratch for rows on their way into prepare(kCopy); reused across tensors.
  const Buffer& staging_for(size_t bytes);
  void advance(uint64_t bytes);

  const Checkpoint& checkpoint_;
  Backend& backend_;
  const QuantConfig* quant_ = nullptr;
  std::vector<ModuleReport> report_;
  WeightPlacement placement_;
  void (*progress_)(uint64_t, uint64_t);
  uint64_t done_ = 0;
  std::set<std::string, std::less<>> claimed_;
  std::vector<std::shared_ptr<const Buffer>> storage_;
  Buffer staging_;
};

}  // namespace metrale
