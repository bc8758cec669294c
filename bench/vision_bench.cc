// Images per second through the Qwen2-VL image path (smart_resize, bicubic resize, normalise,
// patchify) on the committed test photos, decoded once up front. Compare with
// tools/bench/vision_peer.py (the HF processors on the same files, one thread). Run from the
// repository root: ./build/<preset>/bench/vision_bench
#include <benchmark/benchmark.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vision/decode.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"

namespace {

using namespace metrale::vision;

const char* const kPhotos[] = {"photo_chelsea.jpg", "photo_coffee_444.jpg", "photo_rocket_422.jpg",
                               "photo_odd_301x201.png", "photo_progressive.jpg"};

const std::vector<Image>& photos() {
  static const std::vector<Image> images = [] {
    std::vector<Image> out;
    for (const char* name : kPhotos) {
      std::ifstream in(std::string("tests/data/vision/images/") + name, std::ios::binary);
      if (!in) continue;
      const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in),
                                       std::istreambuf_iterator<char>()};
      out.push_back(decode_image(bytes));
    }
    return out;
  }();
  return images;
}

// Qwen2-VL's shipped preprocessor_config.json, with a max_pixels that forces a real
// downscale on these photos (as large inputs do with the default limits).
ImageProcessorConfig qwen_config(ResizeKernel kernel, int64_t max_pixels) {
  ImageProcessorConfig c =
      parse_image_processor_config(nlohmann::json{{"image_processor_type", "Qwen2VLImageProcessor"},
                                                  {"min_pixels", 3136},
                                                  {"max_pixels", max_pixels}},
                                   "bench");
  c.geometry.resize_kernel = kernel;
  return c;
}

void run(benchmark::State& state, ResizeKernel kernel) {
  const auto& images = photos();
  if (images.empty()) {
    state.SkipWithError("run from the repository root: tests/data/vision/images/ not found");
    return;
  }
  const ImageProcessorConfig config = qwen_config(kernel, state.range(0));
  size_t i = 0;
  for (auto _ : state) {
    VisionItem item = preprocess_image(images[i++ % images.size()], config);
    benchmark::DoNotOptimize(item.pixels.data());
  }
  state.counters["images/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_QwenImageTorchvision(benchmark::State& state) { run(state, ResizeKernel::kTorchvision); }
void BM_QwenImagePil(benchmark::State& state) { run(state, ResizeKernel::kPil); }

BENCHMARK(BM_QwenImageTorchvision)
    ->Arg(28 * 28 * 64)
    ->Arg(28 * 28 * 1280)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_QwenImagePil)->Arg(28 * 28 * 64)->Arg(28 * 28 * 1280)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
