#pragma once
// Where a fuzz target finds the repository's fixtures: under $METRALE_SOURCE_DIR when it is set,
// else under the source tree the target was built from (fuzz/CMakeLists.txt), so a target runs
// from any working directory (scripts/fuzz.sh runs each target's workers in its log folder).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

namespace metrale::fuzz {

inline std::string source_path(std::string_view relative) {
  const char* env = std::getenv("METRALE_SOURCE_DIR");
  return std::string(env != nullptr && *env != '\0' ? env : METRALE_SOURCE_DIR) + "/" +
         std::string(relative);
}

// A scratch folder of this process, for targets whose parser reads a file or a folder: under
// /dev/shm (a RAM file system) where there is one, else the temp directory. Rewriting a file on a
// disk file system every input (ext4 flushes a truncated file when it is closed) cost more than
// the parsing it feeds.
inline std::filesystem::path scratch_dir(std::string_view name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path base =
      fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
  const fs::path dir = base / (std::string(name) + "." + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir;
}

}  // namespace metrale::fuzz
