#pragma once
// `metrale bench --image FILE`: the vision tower alone. Each image is decoded and preprocessed
// once (the checkpoint's preprocessor_config.json, as `generate --image`), then the tower
// (patch embedding, blocks, merger and any deepstack mergers: VisionEncoder::encode) runs
// --image-warmup untimed and --image-rounds timed passes on its pixels; reported per image:
// the median ms per pass and images/s, with the grid and patch count. No prompt, no language
// model step. The peer that runs transformers' tower on the same pixels beside it is
// bench/compare/vision_tower.py.
#include <string>
#include <vector>

#include "backend/op_profiler.h"
#include "cli/options.h"

namespace metrale::cli {

struct ImageBenchFlags {
  std::vector<std::string> images;
  int rounds = 5;        // timed passes per image
  int warmup = 1;        // untimed passes before them
  std::string out;       // "": none; else a .safetensors of each image's pixels and tower output
  bool profile = false;  // also one more pass per image under an OpProfiler, printed per op
};

// bench.cc's per-op table of `prof`'s tallies, sorted by time: per op (and weight) time per
// `unit` (`units` of them were timed in `seconds`), its share, and what falls between the ops.
void print_profile_table(const OpProfiler& prof, const char* title, const char* unit, double units,
                         double seconds);

// Throws Error when the checkpoint has no vision tower metrale runs (a text-only model), or
// naming the file when an image cannot be read, decoded or preprocessed.
void run_image_bench(const ModelFlags& model, const ImageBenchFlags& flags, bool json);

}  // namespace metrale::cli
