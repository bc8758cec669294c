#include "http/media_parts.h"

#include <fstream>
#include <iterator>
#include <system_error>

#include "http/openai_api.h"
#include "vision/decode.h"

namespace metrale::http {
namespace {

namespace fs = std::filesystem;

ApiError refuse(const std::string& where, const std::string& message) {
  return ApiError(400, where + ": " + message, where);
}

std::string describe(const nlohmann::ordered_json& v) {
  const std::string text = v.dump();
  return text.size() <= 40 ? text : text.substr(0, 40) + "...";
}

// The URL of an image_url / video_url value: {"url": "..."} or a bare string.
std::string url_of(const nlohmann::ordered_json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_object() || !v.contains("url") || !v["url"].is_string())
    throw refuse(where, "expected {\"url\": a string}, found " + describe(v));
  return v["url"].get<std::string>();
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::vector<fs::path> canonical_media_dirs(const std::vector<std::string>& dirs) {
  std::vector<fs::path> out;
  for (const std::string& d : dirs) {
    std::error_code ec;
    const fs::path c = fs::canonical(d, ec);
    METRALE_CHECK(!ec && fs::is_directory(c), "--allowed-media-dir ", d,
                  ": expected an existing directory", ec ? " (" + ec.message() + ")" : "");
    out.push_back(c);
  }
  return out;
}

std::vector<MediaPart> take_media_parts(nlohmann::ordered_json& messages) {
  std::vector<MediaPart> parts;
  if (!messages.is_array()) return parts;
  for (size_t i = 0; i < messages.size(); ++i) {
    nlohmann::ordered_json& m = messages[i];
    if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
    nlohmann::ordered_json& content = m["content"];
    for (size_t j = 0; j < content.size(); ++j) {
      nlohmann::ordered_json& part = content[j];
      if (!part.is_object()) continue;
      const std::string at =
          "messages[" + std::to_string(i) + "].content[" + std::to_string(j) + "]";
      std::string type;
      if (part.contains("type")) {
        if (!part["type"].is_string()) throw refuse(at, "\"type\" must be a string");
        type = part["type"].get<std::string>();
      } else if (part.contains("image_url")) {
        type = "image_url";
      } else if (part.contains("video_url")) {
        type = "video_url";
      }
      if (type != "image_url" && type != "video_url") continue;
      const std::string where = at + "." + type;
      if (!part.contains(type)) throw refuse(at, "a \"" + type + "\" part needs \"" + type + "\"");
      parts.push_back(
          {.kind = type == "image_url" ? vision::VisionKind::kImage : vision::VisionKind::kVideo,
           .url = url_of(part[type], where),
           .where = where});
      part = nlohmann::ordered_json{{"type", type == "image_url" ? "image" : "video"}};
    }
  }
  return parts;
}

fs::path resolve_media_file(std::string_view url, const MediaOptions& options,
                            const std::string& where) {
  constexpr std::string_view kScheme = "file://";
  if (url.substr(0, kScheme.size()) != kScheme) throw refuse(where, "expected a file:// URL");
  std::string_view rest = url.substr(kScheme.size());
  if (rest.substr(0, 9) == "localhost") rest.remove_prefix(9);
  if (rest.empty() || rest.front() != '/')
    throw refuse(where, "a file:// URL needs an absolute path (file:///dir/file.png)");
  std::string path;  // percent-decoded
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == '%') {
      const int hi = i + 2 < rest.size() ? hex_value(rest[i + 1]) : -1;
      const int lo = hi >= 0 ? hex_value(rest[i + 2]) : -1;
      if (lo < 0) throw refuse(where, "a malformed %-escape in the file:// URL");
      path.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      path.push_back(rest[i]);
    }
  }
  if (path.find('\0') != std::string::npos) throw refuse(where, "the path holds a NUL byte");
  if (options.allowed_dirs.empty()) {
    throw refuse(where,
                 "file:// URLs are not allowed on this server (start it with "
                 "--allowed-media-dir DIR); send the bytes as a data: URL");
  }
  for (const fs::path& c : fs::path(path)) {
    if (c == "..") throw refuse(where, "the path may not contain '..'");
  }
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  if (ec) throw refuse(where, "cannot open " + path + " (" + ec.message() + ")");
  bool inside = false;
  for (const fs::path& dir : options.allowed_dirs) {
    auto d = dir.begin();
    auto p = real.begin();
    while (d != dir.end() && p != real.end() && *d == *p) ++d, ++p;
    if (d == dir.end()) inside = true;
  }
  // (A symlink inside an allowed directory that points out of it resolves outside: refused.)
  if (!inside) throw refuse(where, path + " is outside the directories --allowed-media-dir allows");
  if (!fs::is_regular_file(real, ec)) throw refuse(where, path + " is not a regular file");
  return real;
}

std::vector<uint8_t> read_media_part(const MediaPart& part, const MediaOptions& options) {
  const std::string& url = part.url;
  const std::string limit = std::to_string(options.max_bytes);
  if (url.rfind("data:", 0) == 0) {
    // base64 holds 3 bytes per 4 characters: refuse what is too big before decoding it.
    const size_t comma = url.find(',');
    if (comma != std::string::npos && (url.size() - comma - 1) / 4 * 3 > options.max_bytes + 3)
      throw refuse(part.where, "the data: URL holds more than " + limit + " bytes");
    std::vector<uint8_t> bytes;
    try {
      bytes = vision::decode_base64_payload(url);
    } catch (const Error& e) {
      throw refuse(part.where, e.message());
    }
    if (bytes.size() > options.max_bytes)
      throw refuse(part.where, "the data: URL holds " + std::to_string(bytes.size()) +
                                   " bytes; at most " + limit + " are accepted");
    return bytes;
  }
  if (url.rfind("file://", 0) == 0) {
    const fs::path file = resolve_media_file(url, options, part.where);
    std::error_code ec;
    const uintmax_t size = fs::file_size(file, ec);
    if (ec) throw refuse(part.where, "cannot read " + file.string());
    if (size > options.max_bytes)
      throw refuse(part.where, file.string() + " has " + std::to_string(size) + " bytes; at most " +
                                   limit + " are accepted");
    std::ifstream in(file, std::ios::binary);
    if (!in) throw refuse(part.where, "cannot open " + file.string());
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) {
    throw refuse(part.where,
                 "http(s) URLs are not fetched (this server makes no network requests): send the "
                 "bytes as a data: URL, or a file:// path under --allowed-media-dir");
  }
  throw refuse(part.where, "expected a data: or file:// URL, found \"" +
                               url.substr(0, std::min<size_t>(url.size(), 32)) + "\"");
}

}  // namespace metrale::http
