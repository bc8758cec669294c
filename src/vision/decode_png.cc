// PNG via libpng, with no libpng colour transforms: samples come out raw (one per byte for
// low bit depths) and we convert them as PIL does: grey scaled to 8 bits, 16-bit RGB(A)/LA
// keep the high byte, 16-bit grey ("I;16") is clipped to 255, palette indices past PLTE are
// black, tRNS and alpha are ignored (convert("RGB") drops them). Fatal libpng errors longjmp
// out of small C-style functions that hold no C++ objects.
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

#include <png.h>

#include "core/error.h"
#include "vision/decode_internal.h"
#include "vision/exif.h"

namespace metrale::vision::detail {
namespace {

struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[256];
};

extern "C" void png_on_error(png_structp png, png_const_charp msg) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof(src->message), "%s", msg);
  png_longjmp(png, 1);
}
extern "C" void png_on_warning(png_structp, png_const_charp) {}

extern "C" void png_read_from_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "unexpected end of data (truncated file)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

bool read_info(png_structp png, png_infop info) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  return true;
}

bool read_rows(png_structp png, png_infop info, png_bytepp rows, int passes, png_uint_32 height) {
  if (setjmp(png_jmpbuf(png))) return false;
  (void)info;
  for (int pass = 0; pass < passes; ++pass) {
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, rows[passes > 1 ? y : 0], nullptr);
  }
  return true;
}

bool read_end(png_structp png, png_infop info) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_end(png, info);
  return true;
}

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReader() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

// EXIF from eXIf, or from the "Raw profile type exif" text chunk (hex after 3 header lines);
// XMP from iTXt "XML:com.adobe.xmp" as PIL's fallback.
int find_orientation(png_structp png, png_infop info) {
  png_uint_32 exif_size = 0;
  png_bytep exif = nullptr;
  bool have_exif = false;
  if (png_get_eXIf_1(png, info, &exif_size, &exif) != 0 && exif != nullptr) {
    have_exif = true;
    if (int o = exif_orientation({exif, exif_size})) return o;
  }
  png_textp text = nullptr;
  int n_text = 0;
  png_get_text(png, info, &text, &n_text);
  int from_xmp = 0;
  for (int i = 0; i < n_text; ++i) {
    std::string_view key = text[i].key;
    std::string_view value(text[i].text,
                           text[i].text_length ? text[i].text_length : text[i].itxt_length);
    if (!have_exif && key == "Raw profile type exif") {
      have_exif = true;
      size_t at = 0;
      for (int line = 0; line < 3 && at != std::string_view::npos; ++line) {
        at = value.find('\n', at == 0 && line == 0 ? 0 : at + 1);
      }
      if (at == std::string_view::npos) continue;
      std::vector<uint8_t> blob;
      int hi = -1;
      for (char c : value.substr(at + 1)) {
        int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (v < 0) continue;
        if (hi < 0) {
          hi = v;
        } else {
          blob.push_back(uint8_t(hi << 4 | v));
          hi = -1;
        }
      }
      if (int o = exif_orientation(blob)) return o;
    } else if (key == "XML:com.adobe.xmp" && from_xmp == 0) {
      from_xmp = xmp_orientation(value);
    }
  }
  return from_xmp == 0 ? 1 : from_xmp;
}

}  // namespace

DecodedStill decode_png(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  // Refuse oversized images from IHDR alone, before libpng reads on (and before a header-only
  // bomb fails later as a mere truncation).
  if (bytes.size() >= 24 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0) {
    auto be32 = [&](size_t at) {
      return int64_t(bytes[at]) << 24 | bytes[at + 1] << 16 | bytes[at + 2] << 8 | bytes[at + 3];
    };
    check_dimensions(be32(16), be32(20), limits, "PNG");
  }
  PngSource src{bytes.data(), bytes.size(), 0, {}};
  PngReader r;
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
  METRALE_CHECK(r.png != nullptr, "PNG: cannot create a libpng reader");
  r.info = png_create_info_struct(r.png);
  METRALE_CHECK(r.info != nullptr, "PNG: cannot create a libpng info struct");
  png_set_read_fn(r.png, &src, png_read_from_memory);
  // libpng's own guard against huge ancillary chunks (zTXt bombs); IHDR is checked by us.
  png_set_chunk_malloc_max(r.png, 16u << 20);
  png_set_user_limits(r.png, 0x7fffffff, 0x7fffffff);
  if (!read_info(r.png, r.info)) throw make_error("PNG: bad header: ", src.message);

  const png_uint_32 w = png_get_image_width(r.png, r.info);
  const png_uint_32 h = png_get_image_height(r.png, r.info);
  const int depth = png_get_bit_depth(r.png, r.info);
  const int color = png_get_color_type(r.png, r.info);
  DecodedStill still;
  still.image = new_image(w, h, limits, "PNG");
  if (depth < 8) png_set_packing(r.png);  // one sample per byte, unscaled
  const int passes = png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  const size_t rowbytes = png_get_rowbytes(r.png, r.info);
  const int channels = png_get_channels(r.png, r.info);

  // Non-interlaced images stream through one row; interlaced ones need every row kept.
  const size_t n_rows = passes > 1 ? h : 1;
  std::vector<uint8_t> raw(rowbytes * n_rows);
  std::vector<png_bytep> rows(n_rows);
  for (size_t y = 0; y < n_rows; ++y) rows[y] = raw.data() + y * rowbytes;

  png_colorp plte = nullptr;
  int n_plte = 0;
  if (color == PNG_COLOR_TYPE_PALETTE) png_get_PLTE(r.png, r.info, &plte, &n_plte);
  const int bytes_per_sample = depth == 16 ? 2 : 1;
  // PIL widens 1/2/4-bit grey by replication (x255, x85, x17).
  const int grey_scale = depth == 1 ? 255 : depth == 2 ? 85 : depth == 4 ? 17 : 1;

  auto convert_row = [&](const uint8_t* in, uint8_t* out) {
    for (png_uint_32 x = 0; x < w; ++x, out += 3) {
      const uint8_t* px = in + size_t(x) * channels * bytes_per_sample;
      if (color == PNG_COLOR_TYPE_PALETTE) {
        const int i = px[0];
        if (i < n_plte) {
          out[0] = plte[i].red, out[1] = plte[i].green, out[2] = plte[i].blue;
        } else {
          out[0] = out[1] = out[2] = 0;
        }
      } else if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) {
        int v;
        if (depth == 16) {
          // Plain grey is PIL's "I;16", clipped by convert(); LA keeps the high byte.
          v = color == PNG_COLOR_TYPE_GRAY ? std::min(px[0] << 8 | px[1], 255) : px[0];
        } else {
          v = px[0] * grey_scale;
        }
        out[0] = out[1] = out[2] = static_cast<uint8_t>(v);
      } else {  // RGB, RGBA: high byte of 16-bit samples
        for (int c = 0; c < 3; ++c) out[c] = px[c * bytes_per_sample];
      }
    }
  };

  if (passes > 1) {
    if (!read_rows(r.png, r.info, rows.data(), passes, h)) {
      throw make_error("PNG: corrupt or truncated data: ", src.message);
    }
    for (png_uint_32 y = 0; y < h; ++y) convert_row(rows[y], still.image.row(int(y)));
  } else {
    for (png_uint_32 y = 0; y < h; ++y) {
      if (!read_rows(r.png, r.info, rows.data(), 1, 1)) {
        throw make_error("PNG: corrupt or truncated data at row ", y, " of ", h, ": ", src.message);
      }
      convert_row(rows[0], still.image.row(int(y)));
    }
  }
  // Chunks after IDAT may carry eXIf; like PIL, a damaged tail after complete pixel data is
  // not fatal.
  read_end(r.png, r.info);
  still.orientation = find_orientation(r.png, r.info);
  return still;
}

}  // namespace metrale::vision::detail
