// JPEG via libjpeg-turbo with the settings PIL uses (JDCT_ISLOW, fancy upsampling, libjpeg's
// own YCbCr->RGB), so pixels match PIL's exactly. libjpeg reports fatal errors by calling
// error_exit, which must not return; we longjmp out of small C-style functions whose frames
// hold no C++ objects, then throw from ordinary code.
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include <jerror.h>
#include <jpeglib.h>

#include "core/error.h"
#include "vision/decode_internal.h"
#include "vision/exif.h"

namespace metrale::vision::detail {
namespace {

struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

extern "C" void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are ignored (PIL ignores them too) except running out of data: libjpeg would pad
// with grey, but PIL reports "image file is truncated", and so do we.
extern "C" void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
    std::snprintf(err->message, sizeof(err->message), "premature end of data (truncated file)");
    std::longjmp(err->jump, 1);
  }
}

bool read_header(jpeg_decompress_struct* cinfo, JpegErrorManager* err, const uint8_t* data,
                 size_t size) {
  if (setjmp(err->jump)) return false;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(cinfo, TRUE);
  return true;
}

bool read_pixels(jpeg_decompress_struct* cinfo, JpegErrorManager* err, uint8_t* out,
                 size_t stride) {
  if (setjmp(err->jump)) return false;
  jpeg_start_decompress(cinfo);
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + static_cast<size_t>(cinfo->output_scanline) * stride;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

// Owns the decompressor so every exit path (return or throw) destroys it.
struct JpegDecompressor {
  jpeg_decompress_struct cinfo{};
  JpegErrorManager err{};
  JpegDecompressor() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_on_error;
    err.pub.emit_message = jpeg_on_message;
    jpeg_create_decompress(&cinfo);
  }
  ~JpegDecompressor() { jpeg_destroy_decompress(&cinfo); }
  JpegDecompressor(const JpegDecompressor&) = delete;
  JpegDecompressor& operator=(const JpegDecompressor&) = delete;
};

// PIL keeps the first "Exif\0\0" APP1 as info["exif"] and falls back to XMP's
// tiff:Orientation only when EXIF has no orientation tag.
int find_orientation(const jpeg_decompress_struct& cinfo) {
  constexpr std::string_view kXmp = "http://ns.adobe.com/xap/1.0/";
  bool have_exif = false;
  int from_xmp = 0;
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m != nullptr; m = m->next) {
    if (m->marker != JPEG_APP0 + 1) continue;
    std::span<const uint8_t> data(m->data, m->data_length);
    if (!have_exif && data.size() >= 6 && std::memcmp(data.data(), "Exif\0\0", 6) == 0) {
      have_exif = true;
      if (int o = exif_orientation(data)) return o;
    } else if (from_xmp == 0 && data.size() > kXmp.size() + 1 &&
               std::memcmp(data.data(), kXmp.data(), kXmp.size()) == 0) {
      from_xmp = xmp_orientation(
          std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
    }
  }
  return from_xmp == 0 ? 1 : from_xmp;
}

}  // namespace

DecodedStill decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  JpegDecompressor d;
  if (!read_header(&d.cinfo, &d.err, bytes.data(), bytes.size())) {
    throw make_error("JPEG: bad header: ", d.err.message);
  }
  const int components = d.cinfo.num_components;
  METRALE_CHECK(components == 1 || components == 3 || components == 4,
                "JPEG: expected 1, 3 or 4 components, found ", components);
  // Mode as PIL picks it: 1 -> L, 3 -> RGB (libjpeg converts YCbCr), 4 -> CMYK.
  d.cinfo.out_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
  d.cinfo.dct_method = JDCT_ISLOW;
  d.cinfo.do_fancy_upsampling = TRUE;
  DecodedStill still;
  // Saved markers live in libjpeg's image pool, which jpeg_finish_decompress() frees.
  still.orientation = find_orientation(d.cinfo);
  still.image = new_image(d.cinfo.image_width, d.cinfo.image_height, limits, "JPEG");
  const size_t w = still.image.width, h = still.image.height;
  std::vector<uint8_t> raw;
  uint8_t* out = still.image.rgb.data();
  if (components != 3) {
    raw.resize(w * h * components);
    out = raw.data();
  }
  if (!read_pixels(&d.cinfo, &d.err, out, w * components)) {
    throw make_error("JPEG: corrupt or truncated data: ", d.err.message);
  }
  METRALE_CHECK(static_cast<int>(d.cinfo.output_components) == components,
                "JPEG: decoder produced ", d.cinfo.output_components, " components, expected ",
                components);
  uint8_t* rgb = still.image.rgb.data();
  if (components == 1) {
    for (size_t i = 0; i < w * h; ++i) rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = raw[i];
  } else if (components == 4) {
    // PIL always reads 4-component JPEGs as Adobe-inverted CMYK ("CMYK;I").
    for (size_t i = 0; i < w * h; ++i) {
      const uint8_t* p = &raw[4 * i];
      const int k = 255 - p[3];
      for (int c = 0; c < 3; ++c) rgb[3 * i + c] = cmyk_channel(255 - p[c], k);
    }
  }
  return still;
}

}  // namespace metrale::vision::detail
