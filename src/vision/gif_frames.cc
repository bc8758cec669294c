// GIF frames via giflib's record-level API (not DGifSlurp, which would decode every frame
// before we could apply a limit), composed the way PIL composes them; see gif_frames.h.
#include "vision/gif_frames.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include <gif_lib.h>

#include "core/error.h"
#include "vision/decode_internal.h"

namespace metrale::vision {
namespace {

struct MemoryInput {
  std::span<const uint8_t> data;
  size_t pos = 0;
};

extern "C" int gif_read_from_memory(GifFileType* gif, GifByteType* out, int n) {
  auto* in = static_cast<MemoryInput*>(gif->UserData);
  const size_t take = std::min(static_cast<size_t>(std::max(n, 0)), in->data.size() - in->pos);
  std::memcpy(out, in->data.data() + in->pos, take);
  in->pos += take;
  return static_cast<int>(take);
}

struct GifCloser {
  GifFileType* gif = nullptr;
  ~GifCloser() {
    int err = 0;
    if (gif != nullptr) DGifCloseFile(gif, &err);
  }
};

// A palette of RGB triples, or none when PIL would treat the image as greyscale ("L").
struct Palette {
  std::vector<std::array<uint8_t, 3>> colors;
  bool present() const { return !colors.empty(); }
  std::array<uint8_t, 3> lookup(int i) const {  // PIL: indices past the palette are black
    if (!present()) return {uint8_t(i), uint8_t(i), uint8_t(i)};
    return i < int(colors.size()) ? colors[i] : std::array<uint8_t, 3>{0, 0, 0};
  }
  std::array<uint8_t, 3> color_for_fill(int i) const {  // PIL's _rgb(): out of range -> entry 0
    if (!present()) return {uint8_t(i), uint8_t(i), uint8_t(i)};
    return colors[i < int(colors.size()) ? i : 0];
  }
};

// PIL ignores a palette that is exactly the identity grey ramp (_is_palette_needed).
std::optional<Palette> read_palette(const ColorMapObject* map) {
  if (map == nullptr) return std::nullopt;
  Palette p;
  bool ramp = true;
  for (int i = 0; i < map->ColorCount; ++i) {
    const GifColorType& c = map->Colors[i];
    p.colors.push_back({c.Red, c.Green, c.Blue});
    ramp = ramp && c.Red == i && c.Green == i && c.Blue == i;
  }
  if (ramp) p.colors.clear();
  return p;
}

struct Rect {
  int x0, y0, x1, y1;
};

enum class Mode { kP, kL, kRgb };

std::string gif_error(const GifFileType* gif) {
  const char* s = GifErrorString(gif->Error);
  return s != nullptr ? s : "unknown giflib error";
}

}  // namespace

GifAnimation decode_gif_frames(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                               size_t max_frames, size_t max_total_bytes) {
  MemoryInput input{bytes};
  int open_error = 0;
  GifCloser closer;
  closer.gif = DGifOpen(&input, gif_read_from_memory, &open_error);
  if (closer.gif == nullptr) {
    const char* s = GifErrorString(open_error);
    throw make_error("GIF: cannot read the header: ", s != nullptr ? s : "unknown error");
  }
  GifFileType* gif = closer.gif;
  const std::optional<Palette> global = read_palette(gif->SColorMap);
  const int background = gif->SColorMap != nullptr ? gif->SBackGroundColor : 0;

  GifAnimation anim;
  int width = gif->SWidth, height = gif->SHeight;
  Mode mode = Mode::kP;
  Palette palette0;                      // frame 0's palette, for P mode
  std::vector<uint8_t> indices;          // canvas in P/L mode
  Image canvas;                          // canvas in RGB mode
  std::optional<int> info_transparency;  // PIL's info["transparency"]
  int disposal_method = 0;               // sticky, as in PIL
  // Pending disposal of the previous frame: a fill (index or colour) or a saved region.
  struct Dispose {
    Rect rect{};
    bool active = false;
    bool is_copy = false;
    int index = 0;
    std::array<uint8_t, 3> color{};
    std::vector<uint8_t> saved;  // RGB of `rect` when is_copy
  } dispose;

  std::optional<int> transparency;
  int delay_ms = 0;
  bool has_gce = false;
  size_t total_bytes = 0;
  std::vector<uint8_t> pixels;  // one frame's indices, de-interlaced

  while (anim.frames.size() < max_frames) {
    GifRecordType record;
    if (DGifGetRecordType(gif, &record) == GIF_ERROR) {
      if (!anim.frames.empty() && input.pos >= bytes.size()) break;  // missing trailer
      throw make_error("GIF: corrupt data after frame ", anim.frames.size(), ": ", gif_error(gif));
    }
    if (record == TERMINATE_RECORD_TYPE) break;
    if (record == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      METRALE_CHECK(DGifGetExtension(gif, &code, &ext) != GIF_ERROR,
                    "GIF: corrupt extension: ", gif_error(gif));
      if (code == GRAPHICS_EXT_FUNC_CODE && ext != nullptr && ext[0] >= 4) {
        has_gce = true;
        const int flags = ext[1];
        transparency = (flags & 1) ? std::optional<int>(ext[4]) : std::nullopt;
        delay_ms = (ext[2] | ext[3] << 8) * 10;
        if (int bits = (flags >> 2) & 7; bits != 0) disposal_method = bits;
      }
      while (ext != nullptr) {
        METRALE_CHECK(DGifGetExtensionNext(gif, &ext) != GIF_ERROR,
                      "GIF: corrupt extension data: ", gif_error(gif));
      }
      continue;
    }
    if (record != IMAGE_DESC_RECORD_TYPE) continue;
    METRALE_CHECK(DGifGetImageDesc(gif) != GIF_ERROR, "GIF: corrupt image descriptor of frame ",
                  anim.frames.size(), ": ", gif_error(gif));
    const GifImageDesc& desc = gif->Image;
    const size_t n = anim.frames.size();
    const Rect r{desc.Left, desc.Top, desc.Left + desc.Width, desc.Top + desc.Height};
    const int new_w = std::max(width, r.x1), new_h = std::max(height, r.y1);
    check_dimensions(new_w, new_h, limits, metrale::detail::concat("GIF frame ", n));
    const std::optional<Palette> local = read_palette(desc.ColorMap);
    const Palette frame_palette = local ? *local : (global ? *global : Palette{});

    // Read the frame's indices (rows arrive in interlaced order when Interlace is set).
    pixels.assign(size_t(desc.Width) * desc.Height, 0);
    static constexpr int kStart[] = {0, 4, 2, 1}, kStep[] = {8, 8, 4, 2};
    int pass = 0, y = 0;
    for (int i = 0; i < desc.Height; ++i) {
      int row = i;
      if (desc.Interlace) {
        while (y >= desc.Height) y = kStart[++pass];
        row = y;
        y += kStep[pass];
      }
      METRALE_CHECK(
          DGifGetLine(gif, pixels.data() + size_t(row) * desc.Width, desc.Width) != GIF_ERROR,
          "GIF: corrupt or truncated pixel data in frame ", n, " at row ", i, ": ", gif_error(gif));
    }
    if (desc.Width == 0 || desc.Height == 0) {  // nothing to decode; skip the LZW blocks
      int code_size = 0;
      GifByteType* block = nullptr;
      METRALE_CHECK(DGifGetCode(gif, &code_size, &block) != GIF_ERROR, "GIF: corrupt frame ", n);
      while (block != nullptr) {
        METRALE_CHECK(DGifGetCodeNext(gif, &block) != GIF_ERROR, "GIF: corrupt frame ", n);
      }
    }

    // Grow the canvas when a frame reaches past it (PIL enlarges the image).
    if (n == 0) {
      width = new_w, height = new_h;
    } else if (new_w != width || new_h != height) {
      // Only reachable in RGB/L mode; PIL fills new area with black / index 0.
      if (mode == Mode::kRgb) {
        Image grown = detail::new_image(new_w, new_h, limits, "GIF");
        for (int yy = 0; yy < height; ++yy) std::memcpy(grown.row(yy), canvas.row(yy), width * 3);
        canvas = std::move(grown);
      } else {
        std::vector<uint8_t> grown(size_t(new_w) * new_h, 0);
        for (int yy = 0; yy < height; ++yy) {
          std::memcpy(&grown[size_t(yy) * new_w], &indices[size_t(yy) * width], width);
        }
        indices = std::move(grown);
      }
      width = new_w, height = new_h;
    }
    const size_t frame_bytes = size_t(width) * height * 3;
    METRALE_CHECK(total_bytes + frame_bytes <= max_total_bytes, "GIF: frame ", n, " would bring ",
                  "decoded frames to ", total_bytes + frame_bytes, " bytes, over the limit of ",
                  max_total_bytes);
    total_bytes += frame_bytes;

    // 1. The previous frame's disposal.
    if (dispose.active) {
      for (int yy = dispose.rect.y0; yy < dispose.rect.y1; ++yy) {
        for (int xx = dispose.rect.x0; xx < dispose.rect.x1; ++xx) {
          if (mode == Mode::kRgb) {
            uint8_t* p = canvas.row(yy) + 3 * xx;
            if (dispose.is_copy) {
              const size_t at =
                  3 * (size_t(yy - dispose.rect.y0) * (dispose.rect.x1 - dispose.rect.x0) +
                       (xx - dispose.rect.x0));
              std::memcpy(p, &dispose.saved[at], 3);
            } else {
              std::memcpy(p, dispose.color.data(), 3);
            }
          } else {
            indices[size_t(yy) * width + xx] = uint8_t(dispose.index);
          }
        }
      }
    }
    // 2. After frame 0, a palette image becomes RGB.
    if (n == 1 && mode == Mode::kP) {
      canvas = detail::new_image(width, height, limits, "GIF");
      for (size_t i = 0; i < indices.size(); ++i) {
        auto c = palette0.lookup(indices[i]);
        std::memcpy(&canvas.rgb[3 * i], c.data(), 3);
      }
      mode = Mode::kRgb;
      info_transparency.reset();
    }
    if (n == 0) {
      mode = frame_palette.present() ? Mode::kP : Mode::kL;
      palette0 = frame_palette;
      indices.assign(size_t(width) * height, uint8_t(transparency.value_or(0)));
      if (transparency) info_transparency = transparency;
    }
    // 3. This frame's disposal, prepared now from the canvas as it is (PIL does the same).
    dispose = Dispose{};
    dispose.rect = r;
    if (disposal_method == 2) {
      dispose.active = true;
      std::optional<int> c = info_transparency ? info_transparency : transparency;
      const int index = c.value_or(background);
      dispose.index = index;
      dispose.color = frame_palette.color_for_fill(index);
    } else if (disposal_method == 3) {
      if (n > 0) {
        dispose.active = true;
        dispose.is_copy = mode == Mode::kRgb;
        if (mode == Mode::kRgb) {
          for (int yy = r.y0; yy < r.y1; ++yy) {
            const uint8_t* p = canvas.row(yy) + 3 * r.x0;
            dispose.saved.insert(dispose.saved.end(), p, p + 3 * (r.x1 - r.x0));
          }
        } else {  // L mode: a restore of a single-valued region is not representable; rare
          dispose.active = false;
        }
      } else if (transparency) {
        dispose.active = true;
        dispose.index = *transparency;
        dispose.color = frame_palette.color_for_fill(*transparency);
      }
    }
    // 4. Draw the frame.
    for (int yy = 0; yy < desc.Height; ++yy) {
      for (int xx = 0; xx < desc.Width; ++xx) {
        const int v = pixels[size_t(yy) * desc.Width + xx];
        const int cx = r.x0 + xx, cy = r.y0 + yy;
        if (n == 0) {
          indices[size_t(cy) * width + cx] = uint8_t(v);
        } else if (transparency && v == *transparency) {
          continue;  // masked out (later frames only; frame 0 writes every pixel)
        } else if (mode == Mode::kRgb) {
          auto c = frame_palette.lookup(v);
          std::memcpy(canvas.row(cy) + 3 * cx, c.data(), 3);
        } else {
          indices[size_t(cy) * width + cx] = uint8_t(v);
        }
      }
    }
    // 5. Emit the frame as RGB.
    Image out;
    if (mode == Mode::kRgb) {
      out = canvas;
    } else {
      out = detail::new_image(width, height, limits, "GIF");
      const Palette& p = mode == Mode::kP ? palette0 : Palette{};
      for (size_t i = 0; i < indices.size(); ++i) {
        auto c = p.lookup(indices[i]);
        std::memcpy(&out.rgb[3 * i], c.data(), 3);
      }
    }
    anim.frames.push_back(std::move(out));
    anim.durations_ms.push_back(has_gce ? delay_ms : 0);
    transparency.reset();
    has_gce = false;
    delay_ms = 0;
  }
  METRALE_CHECK(!anim.frames.empty(), "GIF: no image frame found");
  anim.width = width;
  anim.height = height;
  return anim;
}

namespace detail {
DecodedStill decode_gif_first_frame(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  GifAnimation anim = decode_gif_frames(bytes, limits, 1);
  return DecodedStill{std::move(anim.frames[0]), 1};
}
}  // namespace detail

}  // namespace metrale::vision
