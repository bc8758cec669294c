#pragma once
// Runs the built `metrale` binary (build/<dir>/src/metrale next to this test's build/<dir>/tests/)
// and collects its exit code and output, for the CLI tests.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace metrale {

inline std::filesystem::path metrale_binary() {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  return self.parent_path().parent_path() / "src" / "metrale";
}

struct CliRun {
  int status = -1;  // exit code
  std::string out;  // stdout and stderr together (stdout only when asked)
};

// Runs `metrale <verb> <args>`; the arguments are single-quoted for the shell.
inline CliRun run_metrale(const std::string& verb, const std::vector<std::string>& args,
                          bool with_stderr = true) {
  const std::filesystem::path bin = metrale_binary();
  EXPECT_TRUE(std::filesystem::exists(bin))
      << bin << " is missing: build the `metrale` target first";
  std::string cmd = "'" + bin.string() + "' " + verb;
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += with_stderr ? " 2>&1" : " 2>/dev/null";
  CliRun r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace metrale
