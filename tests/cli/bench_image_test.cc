// `metrale bench --image`: the vision tower timed alone on an image, as JSON; --vision-out's
// rows are the tower's (transformers' own, recorded in the fixture); the flags' errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "io/safetensors/file.h"

namespace metrale {
namespace {

const std::string kFixture = "tests/data/fixtures/qwen3_vl_f32";
const std::string kPhoto = "tests/data/vision/images/photo_chelsea.jpg";

std::vector<float> floats(const SafetensorsFile& f, const std::string& key) {
  const auto& t = f.at(key);
  std::vector<float> out(static_cast<size_t>(t.shape.numel()));
  std::memcpy(out.data(), f.bytes(t).data(), out.size() * sizeof(float));
  return out;
}

TEST(BenchImage, TimesTheTowerAndWritesItsRows) {
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("bench_image_" + std::to_string(getpid()));
  const CliRun r =
      run_metrale("bench",
                  {"--model", kFixture, "--image", kPhoto, "--image-rounds", "3", "--image-warmup",
                   "1", "--threads", "1", "--json", "--vision-out", out.string()},
                  /*with_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("threads"), 1);
  EXPECT_EQ(j.at("tower").at("model_type"), "qwen3_vl");
  const nlohmann::json& img = j.at("images").at(0);
  const auto grid = img.at("grid_thw").get<std::vector<int64_t>>();
  ASSERT_EQ(grid.size(), 3u);
  EXPECT_EQ(img.at("patches").get<int64_t>(), grid[0] * grid[1] * grid[2]);
  EXPECT_EQ(img.at("tokens").get<int64_t>(), img.at("patches").get<int64_t>() / 4);
  EXPECT_EQ(img.at("pass_ms").size(), 3u);
  EXPECT_GT(img.at("images_per_s").get<double>(), 0);

  // The fixture's first item is this photo through the same processor: its merged rows (and
  // deepstack features) lead transformers' outputs there.
  const SafetensorsFile got = SafetensorsFile::open(out.string());
  const SafetensorsFile want = SafetensorsFile::open(kFixture + "/tower.safetensors");
  const std::vector<float> rows = floats(got, "vision.0");
  const int64_t tokens = img.at("tokens").get<int64_t>(), cols = 32;
  ASSERT_EQ(static_cast<int64_t>(rows.size()), tokens * 3 * cols);  // merger + 2 deepstack
  const std::vector<std::string> parts = {"merged", "deepstack.0", "deepstack.1"};
  for (size_t p = 0; p < parts.size(); ++p) {
    const std::vector<float> ref = floats(want, parts[p]);
    float worst = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t c = 0; c < cols; ++c) {
        const float a =
            rows[static_cast<size_t>(t * 3 * cols + static_cast<int64_t>(p) * cols + c)];
        const float b = ref[static_cast<size_t>(t * cols + c)];
        worst = std::max(worst, std::abs(a - b) / std::max(1.0f, std::abs(b)));
      }
    }
    EXPECT_LT(worst, 1e-3f) << parts[p];
  }
  std::filesystem::remove(out);
}

TEST(BenchImage, ATextOnlyModelIsAnError) {
  const CliRun r = run_metrale("bench", {"--model", "models/demo", "--image", kPhoto});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--image"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no vision tower"), std::string::npos) << r.out;
}

TEST(BenchImage, BadFlagsAreErrorsNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{"--image", kPhoto, "--image-rounds", "0"}, "--image-rounds"},
      {{"--image", kPhoto, "--image-rounds", "two"}, "--image-rounds"},
      {{"--image", kPhoto, "--image-warmup", "-1"}, "--image-warmup"},
      {{"--image-rounds", "3"}, "--image-rounds"},
      {{"--vision-out", "x.safetensors"}, "--vision-out"},
      {{"--image", "no/such/file.png"}, "--image"},
      {{"--image", kPhoto, "--prefill", "8"}, "--prefill"},
      {{"--image", kPhoto, "--reps", "2"}, "--reps"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--model", kFixture};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliRun r = run_metrale("bench", args);
    EXPECT_NE(r.status, 0) << c.names;
    EXPECT_NE(r.out.find(c.names), std::string::npos) << c.names << ": " << r.out;
  }
}

}  // namespace
}  // namespace metrale
