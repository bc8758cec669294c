#pragma once
// A scratch copy of a fixture checkpoint (tests/data/fixtures/NAME), edited by a test.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/model.h"
#include "fixture_util.h"
#include "io/safetensors/file.h"
#include "io/safetensors/writer.h"
#include "support/test_support.h"

namespace metrale::testing {

namespace fs = std::filesystem;

// Load options for a test that expects a load (or a short run) to fail: one thread, a small
// KV cache.
inline LoadOptions small_load_options() {
  LoadOptions o;
  o.n_threads = 1;
  o.kv_tokens = 32;
  return o;
}

// A scratch copy of a fixture checkpoint, edited by the test.
class CheckpointCopy {
 public:
  explicit CheckpointCopy(const std::string& name) : dir_(scratch_.path()) {
    for (const auto& e : fs::directory_iterator(testing::fixture_dir(name))) {
      fs::copy_file(e.path(), dir_ / e.path().filename());
    }
  }
  const fs::path& dir() const { return dir_; }

  // Rewrites the checkpoint as one model.safetensors: `edit(writer, file)` adds what it
  // wants of every original file's tensors (the original files are removed).
  void rewrite_all(const std::function<void(SafetensorsWriter&, const SafetensorsFile&)>& edit) {
    SafetensorsWriter w;
    std::vector<fs::path> old;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string n = e.path().filename().string();
      // The fixtures' reference outputs (reference.safetensors, mtp_reference.safetensors)
      // are not weights.
      if (n.ends_with(".safetensors") && !n.ends_with("reference.safetensors"))
        old.push_back(e.path());
    }
    std::sort(old.begin(), old.end());
    for (const fs::path& p : old) edit(w, SafetensorsFile::open(p));
    for (const fs::path& p : old) fs::remove(p);
    fs::remove(dir_ / "model.safetensors.index.json");
    w.write(dir_ / "model.safetensors");
  }

  // Rewrites model.safetensors through `edit(name) -> keep?`, optionally adding a tensor.
  void rewrite(const std::function<bool(const std::string&)>& keep, bool add_extra = false) {
    rewrite_all([&](SafetensorsWriter& w, const SafetensorsFile& f) {
      for (const auto& t : f.tensors()) {
        if (keep(t.name)) w.add(t.name, t.dtype, t.shape, f.bytes(t));
      }
      if (std::exchange(add_extra, false)) {
        const float x[2] = {1, 2};
        w.add("model.layers.0.mlp.extra.weight", DType::kF32, Shape{2},
              {reinterpret_cast<const std::byte*>(x), sizeof(x)});
      }
    });
  }
  void replace_in_config(const std::string& from, const std::string& to) {
    std::ifstream in(dir_ / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(dir_ / "config.json") << text;
  }

 private:
  test::ScratchDir scratch_;
  fs::path dir_;
};

// The error message of loading `c` with small_load_options(), or "" when it loads.
inline std::string load_error(const CheckpointCopy& c) {
  return test::error_of([&] { Model::load(c.dir(), small_load_options()); });
}

inline void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "expected '" << part << "' in: " << msg;
}

}  // namespace metrale::testing
