#include "io/safetensors/checkpoint.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "io/json/json_fields.h"
#include "io/safetensors/strict_json.h"

namespace metrale {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";
// Real indexes are a few MB at most; this only stops a hostile file from exhausting memory.
constexpr uint64_t kMaxIndexBytes = 256ull << 20;

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

std::string read_small_file(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  METRALE_CHECK(!ec, path.string(), ": cannot read size: ", ec.message());
  METRALE_CHECK(size <= kMaxIndexBytes, path.string(), ": ", size, " bytes, larger than the ",
                kMaxIndexBytes, "-byte limit for an index file");
  std::ifstream in(path, std::ios::binary);
  METRALE_CHECK(in.good(), path.string(), ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A shard must be a plain file name inside the checkpoint directory: no path that could
// reach elsewhere.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& dir) {
  std::error_code ec;
  METRALE_CHECK(fs::is_directory(dir, ec), dir.string(), ": not a directory",
                fs::exists(dir, ec) ? "" : " (it does not exist)");
  Checkpoint ck;
  ck.dir_ = dir;
  if (is_file(dir / kSingleName)) {
    ck.layout_ = Layout::kSingleFile;
    ck.files_.push_back(SafetensorsFile::open(dir / kSingleName));
    for (const auto& t : ck.files_[0].tensors()) ck.tensors_.push_back({&t, &ck.files_[0]});
  } else if (is_file(dir / kIndexName)) {
    ck.layout_ = Layout::kIndexed;
    ck.open_index(dir / kIndexName);
  } else {
    ck.layout_ = Layout::kAllFiles;
    ck.open_all_files();
  }
  ck.finish();
  return ck;
}

void Checkpoint::open_index(const fs::path& index_path) {
  const std::string where = index_path.string();
  // Depth 8 leaves room for whatever tools put under "metadata"; the weight_map needs 2.
  const json root = safetensors_detail::parse_strict_json(read_small_file(index_path), where, 8);
  const JsonFields index(root, where);
  if (!index.has("weight_map"))
    throw index.missing("weight_map", "an object of tensor name -> file name");
  const JsonFields weight_map = index.req_object("weight_map");
  METRALE_CHECK(!weight_map.object().empty(), where,
                ": weight_map is empty; expected at least one tensor");

  std::map<std::string, std::vector<std::string>> names_by_file;  // sorted: stable file order
  for (const auto& [name, file] : weight_map.object().items()) {
    if (!file.is_string()) {
      throw weight_map.error(name, "expected a file name string, found ",
                             describe_json_value(file));
    }
    const auto& file_name = file.get_ref<const std::string&>();
    if (!is_plain_file_name(file_name)) {
      throw weight_map.error(name, "expected a plain file name inside ", dir_.string(), ", found '",
                             file_name, "'");
    }
    names_by_file[file_name].push_back(name);
  }

  files_.reserve(names_by_file.size());
  for (const auto& [file_name, names] : names_by_file) {
    const fs::path shard = dir_ / file_name;
    METRALE_CHECK(is_file(shard), where, ": maps ", names.size(), " tensor(s) (e.g. '",
                  names.front(), "') to '", file_name, "', which does not exist in ",
                  dir_.string());
    files_.push_back(SafetensorsFile::open(shard));
  }

  size_t i = 0;
  for (const auto& [file_name, names] : names_by_file) {
    const SafetensorsFile& f = files_[i++];
    const std::set<std::string_view> listed(names.begin(), names.end());
    for (const auto& name : names) {
      const SafetensorsTensorInfo* info = f.find(name);
      METRALE_CHECK(info != nullptr, where, ": maps tensor '", name, "' to '", file_name,
                    "', but that file has no such tensor (it holds ", f.tensors().size(), ")");
      tensors_.push_back({info, &f});
    }
    for (const auto& t : f.tensors()) {
      if (listed.count(t.name) == 0) {
        warnings_.push_back(f.path() + ": tensor '" + t.name + "' is not listed in " + kIndexName +
                            "; ignored");
      }
    }
  }
}

void Checkpoint::open_all_files() {
  std::vector<fs::path> paths;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.path().extension() == ".safetensors" && is_file(entry.path()))
      paths.push_back(entry.path());
  }
  METRALE_CHECK(!ec, dir_.string(), ": cannot list directory: ", ec.message());
  METRALE_CHECK(!paths.empty(), dir_.string(), ": no ", kSingleName, ", ", kIndexName,
                " or other *.safetensors file found");
  std::sort(paths.begin(), paths.end());
  files_.reserve(paths.size());
  for (const auto& p : paths) files_.push_back(SafetensorsFile::open(p));

  std::map<std::string_view, const SafetensorsFile*> owner;
  for (const auto& f : files_) {
    for (const auto& t : f.tensors()) {
      const auto [it, inserted] = owner.emplace(t.name, &f);
      METRALE_CHECK(inserted, dir_.string(), ": tensor '", t.name, "' appears in both ",
                    it->second->path(), " and ", f.path(), "; without ", kIndexName,
                    " nothing says which is meant");
      tensors_.push_back({&t, &f});
    }
  }
}

void Checkpoint::finish() {
  std::sort(
      tensors_.begin(), tensors_.end(),
      [](const CheckpointTensor& a, const CheckpointTensor& b) { return a.name() < b.name(); });
  total_bytes_ = 0;
  for (const auto& t : tensors_) total_bytes_ += t.info->nbytes();
}

const CheckpointTensor* Checkpoint::find(std::string_view name) const {
  auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const CheckpointTensor& t, std::string_view n) { return t.name() < n; });
  return it != tensors_.end() && it->name() == name ? &*it : nullptr;
}

const CheckpointTensor& Checkpoint::at(std::string_view name) const {
  const auto* t = find(name);
  METRALE_CHECK(t != nullptr, dir_.string(), ": no tensor named '", name, "' in the checkpoint (",
                tensors_.size(), " tensors in ", files_.size(), " file(s))");
  return *t;
}

void Checkpoint::copy_to(std::string_view name, std::span<std::byte> dst,
                         const CopyOptions& options) const {
  const CheckpointTensor& t = at(name);
  t.file->copy_to(*t.info, dst, options);
}

}  // namespace metrale
