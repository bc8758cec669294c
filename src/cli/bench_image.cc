#include "cli/bench_image.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <span>

#include <nlohmann/json.hpp>

#include "cli/media.h"
#include "core/error.h"
#include "io/config/model_config.h"
#include "io/config/vision_config.h"
#include "io/safetensors/writer.h"
#include "vision/decode.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"

namespace metrale::cli {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct ImageCase {
  std::string file;
  int width = 0, height = 0;  // as decoded
  vision::VisionItem item;
  double decode_ms = 0, preprocess_ms = 0;
  std::vector<double> pass_ms;  // the timed passes
  std::vector<float> out;       // [tokens, out_cols] the last pass's output
};

ImageCase prepare(const std::string& path, const vision::ImageProcessorConfig& config) {
  ImageCase c{.file = path};
  with_context(path, [&] {
    const std::vector<uint8_t> bytes = read_bytes(path);
    double t0 = now_ms();
    const vision::Image image = vision::decode_image(bytes);
    c.decode_ms = now_ms() - t0;
    c.width = image.width;
    c.height = image.height;
    t0 = now_ms();
    c.item = vision::preprocess_image(image, config);
    c.preprocess_ms = now_ms() - t0;
  });
  return c;
}

void write_outputs(const std::string& path, const std::vector<ImageCase>& cases, int64_t out_cols) {
  auto bytes = [](const std::vector<float>& v) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()),
                                      v.size() * sizeof(float));
  };
  SafetensorsWriter w;
  for (size_t i = 0; i < cases.size(); ++i) {
    const vision::VisionItem& it = cases[i].item;
    const std::string n = std::to_string(i);
    w.add("pixel_values." + n, DType::kF32, Shape{it.n_patches(), it.patch_dim}, bytes(it.pixels));
    w.add("vision." + n, DType::kF32, Shape{it.n_tokens(), out_cols}, bytes(cases[i].out));
    w.set_metadata("grid_thw." + n, nlohmann::json(it.grid_thw).dump());
    w.set_metadata("file." + n, cases[i].file);
  }
  w.write(path);
}

}  // namespace

void run_image_bench(const ModelFlags& flags, const ImageBenchFlags& f, bool json) {
  METRALE_CHECK(!f.images.empty(), "bench: no --image given");
  const ModelConfig mc = load_model_config(flags.dir);
  METRALE_CHECK(vision_tower_kind(mc.model_type).has_value(), "--image: ", flags.dir,
                ": model_type \"", mc.model_type,
                "\" has no vision tower metrale runs, so there is nothing to time on an image");
  const vision::ImageProcessorConfig config = vision::load_image_processor_config(flags.dir);
  std::vector<ImageCase> cases;
  int64_t most = 0;
  for (const std::string& path : f.images) {
    cases.push_back(prepare(path, config));
    most = std::max(most, cases.back().item.n_patches());
  }

  LoadOptions o = flags.load_options();
  o.max_image_patches = most;               // a multiple of merge^2, as every item's patch count is
  if (o.kv_tokens == 0) o.kv_tokens = 256;  // the language model only loads; nothing is cached
  std::unique_ptr<Model> model = Model::load(flags.dir, o);
  VisionEncoder* enc = model->vision();
  METRALE_CHECK(enc != nullptr, "--image: ", flags.dir, " loaded without a vision tower");
  const int64_t cols = enc->out_cols();

  for (ImageCase& c : cases) {
    const vision::VisionItem& it = c.item;
    const std::array<std::array<int64_t, 3>, 1> grid{it.grid_thw};
    c.out.assign(static_cast<size_t>(it.n_tokens() * cols), 0.0f);
    const ConstRows pixels{it.pixels.data(), it.n_patches(), it.patch_dim, it.patch_dim};
    const Rows out{c.out.data(), it.n_tokens(), cols, cols};
    for (int r = 0; r < f.warmup; ++r) enc->encode(grid, pixels, out);
    for (int r = 0; r < f.rounds; ++r) {
      const double t0 = now_ms();
      enc->encode(grid, pixels, out);
      c.pass_ms.push_back(now_ms() - t0);
    }
  }
  if (!f.out.empty()) write_outputs(f.out, cases, cols);
  const VisionConfig& vc = enc->config();
  if (json) {
    nlohmann::json j = {{"model", model->dir().string()},
                        {"threads", model->pool().size()},
                        {"compute", flags.compute},
                        {"weights", flags.placement},
                        {"image_rounds", f.rounds},
                        {"image_warmup", f.warmup},
                        {"tower",
                         {{"model_type", vc.model_type},
                          {"depth", vc.depth},
                          {"width", vc.width},
                          {"heads", vc.n_heads},
                          {"mlp_width", vc.mlp_width},
                          {"patch_size", vc.patch_size},
                          {"out_cols", cols}}},
                        {"images", nlohmann::json::array()}};
    for (const ImageCase& c : cases) {
      const double ms = median(c.pass_ms);
      j["images"].push_back({{"file", c.file},
                             {"width", c.width},
                             {"height", c.height},
                             {"resized_width", c.item.resized_width},
                             {"resized_height", c.item.resized_height},
                             {"grid_thw", c.item.grid_thw},
                             {"patches", c.item.n_patches()},
                             {"tokens", c.item.n_tokens()},
                             {"decode_ms", c.decode_ms},
                             {"preprocess_ms", c.preprocess_ms},
                             {"pass_ms", c.pass_ms},
                             {"ms_per_image", ms},
                             {"images_per_s", 1000.0 / ms}});
    }
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "model: %s, %d thread(s), compute %s; vision tower %s (%lld blocks, width %lld); %d "
      "warm-up + %d timed passes per image\n",
      model->dir().string().c_str(), model->pool().size(), flags.compute.c_str(),
      vc.model_type.c_str(), static_cast<long long>(vc.depth), static_cast<long long>(vc.width),
      f.warmup, f.rounds);
  for (const ImageCase& c : cases) {
    const double ms = median(c.pass_ms);
    const auto [lo, hi] = std::minmax_element(c.pass_ms.begin(), c.pass_ms.end());
    std::printf(
        "%s: %dx%d -> %dx%d, grid %lldx%lldx%lld, %lld patches, %lld tokens: %.1f ms/image "
        "(median; min %.1f, max %.1f), %.3f images/s (preprocessing %.1f ms, untimed)\n",
        c.file.c_str(), c.width, c.height, c.item.resized_width, c.item.resized_height,
        static_cast<long long>(c.item.grid_thw[0]), static_cast<long long>(c.item.grid_thw[1]),
        static_cast<long long>(c.item.grid_thw[2]), static_cast<long long>(c.item.n_patches()),
        static_cast<long long>(c.item.n_tokens()), ms, *lo, *hi, 1000.0 / ms, c.preprocess_ms);
  }
  if (f.profile) {
    for (ImageCase& c : cases) {
      const vision::VisionItem& it = c.item;
      const std::array<std::array<int64_t, 3>, 1> grid{it.grid_thw};
      OpProfiler prof;
      model->backend().set_observer(&prof);
      const double t0 = now_ms();
      enc->encode(grid, ConstRows{it.pixels.data(), it.n_patches(), it.patch_dim, it.patch_dim},
                  Rows{c.out.data(), it.n_tokens(), cols, cols});
      const double dt = (now_ms() - t0) / 1e3;
      model->backend().set_observer(nullptr);
      const std::string title =
          "vision tower profile, " + c.file + " (" + std::to_string(it.n_patches()) + " patches)";
      print_profile_table(prof, title.c_str(), "pass", 1.0, dt);
    }
  }
}

}  // namespace metrale::cli
