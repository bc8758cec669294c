#include "vision/processor_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"

namespace metrale::vision {
namespace {

using nlohmann::json;

constexpr std::array<float, 3> kClipMean = {0.48145466f, 0.4578275f, 0.40821073f};
constexpr std::array<float, 3> kClipStd = {0.26862954f, 0.26130258f, 0.27577711f};
constexpr std::array<float, 3> kHalf = {0.5f, 0.5f, 0.5f};

// Field readers: absent (or JSON null, which HF treats as "use the default") leaves `out`.
class Fields {
 public:
  Fields(const json& j, std::string_view source) : j_(j), source_(source) {
    METRALE_CHECK(j.is_object(), source_, ": expected a JSON object, found ", j.type_name());
  }

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  void read_bool(const char* key, bool& out) const {
    if (const json* v = find(key)) {
      METRALE_CHECK(v->is_boolean(), source_, ": field '", key, "' must be a boolean, found ", v->dump());
      out = v->get<bool>();
    }
  }

  int64_t int_value(const json& v, const std::string& name, int64_t lo, int64_t hi) const {
    METRALE_CHECK(v.is_number_integer(), source_, ": field '", name, "' must be an integer, found ", v.dump());
    const int64_t x = v.get<int64_t>();
    METRALE_CHECK(x >= lo && x <= hi, source_, ": field '", name, "' must be in [", lo, ", ", hi, "], found ", x);
    return x;
  }

  template <typename T>
  void read_int(const char* key, T& out, int64_t lo, int64_t hi) const {
    if (const json* v = find(key)) out = static_cast<T>(int_value(*v, key, lo, hi));
  }

  void read_number(const char* key, double& out, double lo, double hi) const {
    if (const json* v = find(key)) {
      METRALE_CHECK(v->is_number(), source_, ": field '", key, "' must be a number, found ", v->dump());
      const double x = v->get<double>();
      METRALE_CHECK(std::isfinite(x) && x >= lo && x <= hi, source_, ": field '", key, "' must be in [", lo, ", ",
                    hi, "], found ", x);
      out = x;
    }
  }

  void read_triple(const char* key, std::array<float, 3>& out, bool nonzero) const {
    const json* v = find(key);
    if (!v) return;
    auto one = [&](const json& x, size_t i) {
      METRALE_CHECK(x.is_number(), source_, ": field '", key, "' must hold numbers, found ", x.dump());
      // HF builds these as float32 tensors/arrays from the Python floats.
      const float f = static_cast<float>(x.get<double>());
      METRALE_CHECK(std::isfinite(f) && (!nonzero || f != 0.0f), source_, ": field '", key, "'[", i,
                    "] must be finite", nonzero ? " and non-zero" : "", ", found ", x.dump());
      return f;
    };
    if (v->is_number()) {
      const float f = one(*v, 0);
      out = {f, f, f};
      return;
    }
    METRALE_CHECK(v->is_array() && v->size() == 3, source_, ": field '", key,
                  "' must be a number or a list of 3 numbers (one per RGB channel), found ", v->dump());
    for (size_t i = 0; i < 3; ++i) out[i] = one((*v)[i], i);
  }

  std::string_view source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
};

std::string string_field(const Fields& f, const char* key) {
  const json* v = f.find(key);
  if (!v) return {};
  METRALE_CHECK(v->is_string(), f.source(), ": field '", key, "' must be a string, found ", v->dump());
  return v->get<std::string>();
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The fields every processor reads. `min_max_override`: the Qwen2-VL classes (image and
// video) let top-level min_pixels/max_pixels replace size.shortest_edge/longest_edge.
void read_geometry(const Fields& f, PatchGeometry& g, bool min_max_override) {
  constexpr int64_t kMaxPixels = int64_t{1} << 40;
  f.read_int("patch_size", g.patch_size, 1, 1024);
  f.read_int("temporal_patch_size", g.temporal_patch_size, 1, 64);
  f.read_int("merge_size", g.merge_size, 1, 64);
  METRALE_CHECK(g.factor() <= 4096, f.source(), ": patch_size * merge_size = ", g.factor(), " is too large");
  f.read_bool("do_resize", g.do_resize);
  f.read_bool("do_rescale", g.do_rescale);
  f.read_number("rescale_factor", g.rescale_factor, 1e-12, 1e12);
  f.read_bool("do_normalize", g.do_normalize);
  f.read_triple("image_mean", g.image_mean, false);
  f.read_triple("image_std", g.image_std, true);
  if (const json* r = f.find("resample")) {
    const int64_t v = f.int_value(*r, "resample", 0, 5);
    METRALE_CHECK(v == 3, f.source(), ": field 'resample' is ", v, "; only 3 (BICUBIC) is supported");
  }

  // size: a dict that, when present, replaces the class default as a whole.
  bool have_min = true, have_max = true;
  if (const json* size = f.find("size")) {
    METRALE_CHECK(size->is_object(), f.source(), ": field 'size' must be an object, found ", size->dump());
    have_min = size->contains("shortest_edge") && !(*size)["shortest_edge"].is_null();
    have_max = size->contains("longest_edge") && !(*size)["longest_edge"].is_null();
    if (have_min) g.min_pixels = f.int_value((*size)["shortest_edge"], "size.shortest_edge", 0, kMaxPixels);
    if (have_max) g.max_pixels = f.int_value((*size)["longest_edge"], "size.longest_edge", 0, kMaxPixels);
  }
  if (min_max_override) {
    if (const json* v = f.find("min_pixels")) {
      g.min_pixels = f.int_value(*v, "min_pixels", 0, kMaxPixels);
      have_min = true;
    }
    if (const json* v = f.find("max_pixels")) {
      g.max_pixels = f.int_value(*v, "max_pixels", 0, kMaxPixels);
      have_max = true;
    }
  }
  // HF raises at preprocessing time when either key is missing or zero; we refuse at load.
  METRALE_CHECK(have_min && g.min_pixels > 0, f.source(),
                ": 'size' must contain a positive 'shortest_edge' (or a top-level 'min_pixels'); found ",
                have_min ? std::to_string(g.min_pixels) : std::string("none"));
  METRALE_CHECK(have_max && g.max_pixels > 0, f.source(),
                ": 'size' must contain a positive 'longest_edge' (or a top-level 'max_pixels'); found ",
                have_max ? std::to_string(g.max_pixels) : std::string("none"));
  METRALE_CHECK(g.min_pixels <= g.max_pixels, f.source(), ": min pixels (size.shortest_edge = ", g.min_pixels,
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
    case VideoFamily::kQwen2Vl: return "qwen2_vl";
    case VideoFamily::kQwen3Vl: return "qwen3_vl";
    case VideoFamily::kGlm4v: return "glm4v";
  }
  return "?";
}

ImageProcessorConfig parse_image_processor_config(const json& j, std::string_view source) {
  const Fields f(j, source);
  ImageProcessorConfig c;
  c.type_name = string_field(f, "image_processor_type");
  const std::string processor_class = string_field(f, "processor_class");
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
    throw make_error(source, ": field 'image_processor_type' is '", c.type_name,
                     "'; expected Qwen2VLImageProcessor or Glm4vImageProcessor (optionally with Fast/Pil)",
                     processor_class.empty() ? "" : ", processor_class '", processor_class,
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
  const Fields f(j, source);
  VideoProcessorConfig c;
  c.type_name = string_field(f, "video_processor_type");
  const std::string processor_class = string_field(f, "processor_class");
  const std::string image_type = string_field(f, "image_processor_type");
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
    throw make_error(source, ": field 'video_processor_type' is '", c.type_name,
                     "'; expected Qwen2VLVideoProcessor, Qwen3VLVideoProcessor or Glm4vVideoProcessor");
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
  f.read_bool("do_sample_frames", c.do_sample_frames);
  f.read_int("min_frames", c.min_frames, 1, 100000);
  f.read_int("max_frames", c.max_frames, 1, 100000);
  f.read_number("max_duration", c.max_duration, 1e-3, 1e9);
  if (f.find("fps") || j.contains("fps")) {
    c.fps.reset();  // an explicit null removes the class default
    if (const json* v = f.find("fps")) {
      double x = 0;
      f.read_number("fps", x, 1e-6, 1e6);
      c.fps = x;
      (void)v;
    }
  }
  if (j.contains("num_frames")) {
    c.num_frames.reset();
    int n = 0;
    if (f.find("num_frames")) {
      f.read_int("num_frames", n, 1, 100000);
      c.num_frames = n;
    }
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
