#pragma once
// A model directory's weights, across however many .safetensors files hold them.
//
// Which files, in the order HuggingFace transformers looks for them:
//   1. model.safetensors                    -> a single file;
//   2. model.safetensors.index.json         -> sharded: its "weight_map" (tensor name ->
//      file name) is the source of truth. Every mapped file must exist and open, and every
//      mapped tensor must be in the file it is mapped to (else an error). A tensor present in
//      a shard but absent from the index is NOT exposed and is reported in warnings(): the
//      index decides which copy of a name is meant, and a stale extra tensor is harmless to
//      ignore but worth telling the user about;
//   3. otherwise every *.safetensors in the directory (sorted by file name), where a name
//      that appears in two files is an error, since nothing says which one is meant.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors/file.h"

namespace metrale {

struct CheckpointTensor {
  const SafetensorsTensorInfo* info = nullptr;
  const SafetensorsFile* file = nullptr;

  std::string_view name() const { return info->name; }
  TensorView view() const { return file->view(*info); }
  std::span<const std::byte> bytes() const { return file->bytes(*info); }
};

class Checkpoint {
 public:
  enum class Layout { kSingleFile, kIndexed, kAllFiles };

  // Opens every weight file of `dir` (see above). Throws metrale::Error naming the file.
  static Checkpoint open(const std::filesystem::path& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  Layout layout() const { return layout_; }
  std::span<const SafetensorsFile> files() const { return files_; }

  // Every exposed tensor, sorted by name.
  std::span<const CheckpointTensor> tensors() const { return tensors_; }
  // nullptr when absent.
  const CheckpointTensor* find(std::string_view name) const;
  // Throws an Error naming the directory and the tensor when absent.
  const CheckpointTensor& at(std::string_view name) const;
  // Sum of the exposed tensors' byte sizes.
  uint64_t total_bytes() const { return total_bytes_; }
  // Non-fatal findings (tensors ignored because the index does not list them).
  const std::vector<std::string>& warnings() const { return warnings_; }

  // Streams one tensor's bytes into caller-owned memory; see SafetensorsFile::copy_to for
  // how this avoids holding two resident copies.
  void copy_to(std::string_view name, std::span<std::byte> dst,
               const CopyOptions& options = {}) const;

 private:
  Checkpoint() = default;
  void open_index(const std::filesystem::path& index_path);
  void open_all_files();
  void finish();

  std::filesystem::path dir_;
  Layout layout_ = Layout::kSingleFile;
  // Vector moves keep element addresses, so CheckpointTensor pointers survive a move of the
  // Checkpoint; files_ is never resized after tensors_ is built.
  std::vector<SafetensorsFile> files_;
  std::vector<CheckpointTensor> tensors_;
  std::vector<std::string> warnings_;
  uint64_t total_bytes_ = 0;
};

}  // namespace metrale
