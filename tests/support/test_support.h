#pragma once
// Helpers every test folder shares: catching the message of an expected metrale::Error, and
// a scratch directory that cleans up after itself. Include as "support/test_support.h".
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace metrale::test {

// The message of the metrale::Error `fn` throws; fails the test when it throws nothing or
// something else.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-metrale exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected a metrale::Error, nothing was thrown";
  return {};
}

// A committed fixture's bytes (path relative to the source root, where ctest runs tests).
inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A fresh directory per test (named after the test and the process), removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "metrale_" + std::string(info->test_suite_name()) + "_" + info->name() +
                       "_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++);
    for (char& c : name) {
      if (c == '/') c = '_';  // parameterised test names contain '/'
    }
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace metrale::test
