#include "vision/processor_config.h"

#include <array>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/json/json_fields.h"
#include "io/json/json_parse.h"

namespace metrale::vision {
namespace {

using nlohmann::json;

constexpr std::array<float, 3> kClipMean = {0.48145466f, 0.4578275f, 0.40821073f};
constexpr std::array<float, 3> kClipStd = {0.26862954f, 0.26130258f, 0.27577711f};
constexpr std::array<float, 3> kHalf = {0.5f, 0.5f, 0.5f};

// Absent (or JSON null, which HF treats as "use the default") leaves `out` as it is.
template <typename T>
void read_int(const JsonFields& f, const char* key, T& out, int64_t lo, int64_t hi) {
  if (std::optional<int64_t> v = f.opt_int_in(key, lo, hi)) out = static_cast<T>(*v);
}

void read_number(const JsonFields& f, const char* key, double& out, double lo, double hi) {
  out = f.opt_number_in(key, lo, hi).value_or(out);
}

// image_mean / image_std: one number for all channels or one per RGB channel.
void read_triple(const JsonFields& f, const char* key, std::array<float, 3>& out, bool nonzero) {
  const json* v = f.find(key);
  if (v == nullptr) return;
  // `element` < 0: the single number that stands for all three.
  auto one = [&](const json& x, int element) {
    // HF builds these as float32 tensors/arrays from the Python floats.
    const float value = x.is_number() ? static_cast<float>(x.get<double>()) : 0.0f;
    if (x.is_number() && std::isfinite(value) && (!nonzero || value != 0.0f)) return value;
    const char* want =
        nonzero ? "expected a finite, non-zero number, found " : "expected a finite number, found ";
    if (element < 0) throw f.error(key, want, describe_json_value(x));
    throw f.error(key, "element ", element, ": ", want, describe_json_value(x));
  };
  if (v->is_number()) {
    out.fill(one(*v, -1));
    return;
  }
  if (!v->is_array() || v->size() != 3) {
    throw f.error(key, "expected a number or a list of 3 numbers (one per RGB channel), found ",
                  describe_json_value(*v));
  }
  for (int i = 0; i < 3; ++i) out[static_cast<size_t>(i)] = one((*v)[static_cast<size_t>(i)], i);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The fields every processor reads. `min_max_override`: the Qwen2-VL classes (image and
// video) let top-level min_pixels/max_pixels replace size.shortest_edge/longest_edge.
void read_geometry(const JsonFields& f, PatchGeometry& g, bool min_max_override) {
  constexpr int64_t kMaxPixels = int64_t{1} << 40;
  read_int(f, "patch_size", g.patch_size, 1, 1024);
  read_int(f, "temporal_patch_size", g.temporal_patch_size, 1, 64);
  read_int(f, "merge_size", g.merge_size, 1, 64);
  METRALE_CHECK(g.factor() <= 4096, f.source(), ": patch_size * merge_size = ", g.factor(),
                " is too large");
  g.do_resize = f.bool_or("do_resize", g.do_resize);
  g.do_rescale = f.bool_or("do_rescale", g.do_rescale);
  read_number(f, "rescale_factor", g.rescale_factor, 1e-12, 1e12);
  g.do_normalize = f.bool_or("do_normalize", g.do_normalize);
  read_triple(f, "image_mean", g.image_mean, false);
  read_triple(f, "image_std", g.image_std, true);
  if (std::optional<int64_t> resample = f.opt_int_in("resample", 0, 5);
      resample && *resample != 3) {
    throw f.error("resample", "found ", *resample, "; only 3 (BICUBIC) is supported");
  }

  // size: a dict that, when present, replaces the class default as a whole.
  bool have_min = true, have_max = true;
  if (std::optional<JsonFields> size = f.opt_object("size")) {
    have_min = size->has("shortest_edge");
    have_max = size->has("longest_edge");
    read_int(*size, "shortest_edge", g.min_pixels, 0, kMaxPixels);
    read_int(*size, "longest_edge", g.max_pixels, 0, kMaxPixels);
  }
  if (min_max_override) {
    if (f.has("min_pixels")) {
      read_int(f, "min_pixels", g.min_pixels, 0, kMaxPixels);
      have_min = true;
    }
    if (f.has("max_pixels")) {
      read_int(f, "max_pixels", g.max_pixels, 0, kMaxPixels);
      have_max = true;
    }
  }
  // HF raises at preprocessing time when either key is missing or zero; we refuse at load.
  METRALE_CHECK(
      have_min && g.min_pixels > 0, f.source(),
      ": 'size' must contain a positive 'shortest_edge' (or a top-level 'min_pixels'); found ",
      have_min ? std::to_string(g.min_pixels) : std::string("none"));
  METRALE_CHECK(
      have_max && g.max_pixels > 0, f.source(),
      ": 'size' must contain a positive 'longest_edge' (or a top-level 'max_pixels'); found ",
      have_max ? std::to_string(g.max_pixels) : std::string("none"));
  METRALE_CHECK(g.min_pixels <= g.max_pixels, f.source(),
                ": min pixels (size.shortest_edge = ", g.min_pixels,
                ") exceed max pixels (size.longest_edge = ", g.max_pixels, ")");
}

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  METRALE_CHECK(in.good(), path.string(), ": cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), path.string());
}

}  // namespace

const char* image_family_name(ImageFamily family) {
  return family == ImageFamily::kGlm4v ? "glm4v" : "qwen2_vl";
}

const char* video_family_name(VideoFamily family) {
  switch (family) {
    case VideoFamily::kQwen2Vl:
      return "qwen2_vl";
    case VideoFamily::kQwen3Vl:
      return "qwen3_vl";
    case VideoFamily::kGlm4v:
      return "glm4v";
  }
  return "?";
}

ImageProcessorConfig parse_image_processor_config(const json& j, std::string_view source) {
  const JsonFields f(j, std::string(source));
  ImageProcessorConfig c;
  c.type_name = f.opt_string("image_processor_type").value_or("");
  const std::string processor_class = f.opt_string("processor_class").value_or("");
  std::string base = c.type_name;
  if (ends_with(base, "Pil")) {
    c.geometry.resize_kernel = ResizeKernel::kPil;
    base.resize(base.size() - 3);
  } else if (ends_with(base, "Fast")) {
    base.resize(base.size() - 4);
  }
  if (base == "Qwen2VLImageProcessor") {
    c.family = ImageFamily::kQwen2Vl;
  } else if (base == "Glm4vImageProcessor") {
    c.family = ImageFamily::kGlm4v;
  } else if (base.empty() && processor_class.rfind("Glm4", 0) == 0) {
    c.family = ImageFamily::kGlm4v;
  } else if (base.empty() && processor_class.rfind("Qwen", 0) == 0) {
    c.family = ImageFamily::kQwen2Vl;
  } else {
    throw f.error("image_processor_type",
                  "expected Qwen2VLImageProcessor or Glm4vImageProcessor (optionally with ",
                  "Fast/Pil), found '", c.type_name, "'",
                  processor_class.empty() ? "" : "; processor_class '", processor_class,
                  processor_class.empty() ? "" : "' is not known either");
  }
  PatchGeometry& g = c.geometry;
  g.image_mean = kClipMean;
  g.image_std = kClipStd;
  if (c.family == ImageFamily::kQwen2Vl) {
    g.min_pixels = 56 * 56;
    g.max_pixels = 28 * 28 * 1280;
  } else {
    g.min_pixels = 112 * 112;
    g.max_pixels = int64_t{28} * 28 * 15000;
  }
  read_geometry(f, g, /*min_max_override=*/c.family == ImageFamily::kQwen2Vl);
  return c;
}

VideoProcessorConfig parse_video_processor_config(const json& j, std::string_view source) {
  const JsonFields f(j, std::string(source));
  VideoProcessorConfig c;
  c.type_name = f.opt_string("video_processor_type").value_or("");
  const std::string processor_class = f.opt_string("processor_class").value_or("");
  const std::string image_type = f.opt_string("image_processor_type").value_or("");
  if (c.type_name == "Qwen2VLVideoProcessor") {
    c.family = VideoFamily::kQwen2Vl;
  } else if (c.type_name == "Qwen3VLVideoProcessor") {
    c.family = VideoFamily::kQwen3Vl;
  } else if (c.type_name == "Glm4vVideoProcessor") {
    c.family = VideoFamily::kGlm4v;
  } else if (c.type_name.empty() && processor_class.rfind("Qwen3", 0) == 0) {
    c.family = VideoFamily::kQwen3Vl;
  } else if (c.type_name.empty() && processor_class.rfind("Glm4", 0) == 0) {
    c.family = VideoFamily::kGlm4v;
  } else if (c.type_name.empty() && processor_class.rfind("Qwen2", 0) == 0) {
    c.family = VideoFamily::kQwen2Vl;
  } else if (c.type_name.empty() && image_type.rfind("Glm4vImageProcessor", 0) == 0) {
    c.family = VideoFamily::kGlm4v;
  } else if (c.type_name.empty() && image_type.rfind("Qwen2VLImageProcessor", 0) == 0) {
    c.family = VideoFamily::kQwen2Vl;
  } else {
    throw f.error(
        "video_processor_type",
        "expected Qwen2VLVideoProcessor, Qwen3VLVideoProcessor or Glm4vVideoProcessor, found '",
        c.type_name, "'");
  }
  PatchGeometry& g = c.geometry;
  switch (c.family) {
    case VideoFamily::kQwen2Vl:
      g.image_mean = kClipMean;
      g.image_std = kClipStd;
      g.min_pixels = 128 * 28 * 28;
      g.max_pixels = 28 * 28 * 768;
      c.do_sample_frames = false;
      break;
    case VideoFamily::kQwen3Vl:
      g.patch_size = 16;
      g.image_mean = kHalf;
      g.image_std = kHalf;
      g.min_pixels = 128 * 32 * 32;
      g.max_pixels = 32 * 32 * 768;
      c.do_sample_frames = true;
      c.fps = 2.0;
      break;
    case VideoFamily::kGlm4v:
      g.image_mean = kClipMean;
      g.image_std = kClipStd;
      g.min_pixels = 112 * 112;
      g.max_pixels = int64_t{28} * 28 * 2 * 30000;
      c.do_sample_frames = true;
      c.fps = 2.0;
      break;
  }
  read_geometry(f, g, /*min_max_override=*/c.family == VideoFamily::kQwen2Vl);
  // Video processors always resize through torchvision in transformers 5.x.
  g.resize_kernel = ResizeKernel::kTorchvision;
  c.do_sample_frames = f.bool_or("do_sample_frames", c.do_sample_frames);
  read_int(f, "min_frames", c.min_frames, 1, 100000);
  read_int(f, "max_frames", c.max_frames, 1, 100000);
  read_number(f, "max_duration", c.max_duration, 1e-3, 1e9);
  // An explicit null removes the class default.
  if (j.contains("fps")) c.fps = f.opt_number_in("fps", 1e-6, 1e6);
  if (j.contains("num_frames")) {
    c.num_frames.reset();
    if (std::optional<int64_t> n = f.opt_int_in("num_frames", 1, 100000))
      c.num_frames = static_cast<int>(*n);
  }
  return c;
}

ImageProcessorConfig load_image_processor_config(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "preprocessor_config.json";
  return parse_image_processor_config(read_json_file(path), path.string());
}

VideoProcessorConfig load_video_processor_config(const std::filesystem::path& model_dir) {
  auto path = model_dir / "video_preprocessor_config.json";
  if (!std::filesystem::exists(path)) path = model_dir / "preprocessor_config.json";
  return parse_video_processor_config(read_json_file(path), path.string());
}

}  // namespace metrale::vision
