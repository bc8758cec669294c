// decode_video(): GIFs in-process, everything else through ffmpeg writing a PNG stream
// (`-f image2pipe -vcodec png -pix_fmt rgb24`), which carries each frame's size and so
// survives mid-stream resolution changes and rotation metadata that ffmpeg applies.
#include "vision/video.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "vision/decode_internal.h"
#include "vision/ffmpeg.h"
#include "vision/gif_frames.h"

namespace metrale::vision {
namespace {

// ffmpeg reads a path, not stdin: MP4s with the index (moov) at the end need a seekable input.
struct TempFile {
  std::string path;
  explicit TempFile(std::span<const uint8_t> bytes) {
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir != nullptr && *dir ? dir : "/tmp") + "/metrale-video-XXXXXX";
    int fd = ::mkstemp(tmpl.data());
    METRALE_CHECK(fd >= 0, "video: cannot create a temporary file in ", tmpl, ": ",
                  std::strerror(errno));
    path = tmpl;
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int e = errno;
        ::close(fd);
        ::unlink(path.c_str());
        throw make_error("video: cannot write temporary file ", path, ": ", std::strerror(e));
      }
      done += size_t(n);
    }
    ::close(fd);
  }
  ~TempFile() { ::unlink(path.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

FfmpegProbe require_ffmpeg() {
  FfmpegProbe p = resolve_ffmpeg();
  METRALE_CHECK(p.state == FfmpegState::kReady, "video: decoding this container needs ffmpeg, ",
                "which is not available: ", p.detail);
  return p;
}

double parse_rate(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return std::atof(s.c_str());
  const double num = std::atof(s.substr(0, slash).c_str());
  const double den = std::atof(s.substr(slash + 1).c_str());
  return den > 0 ? num / den : 0;
}

VideoInfo probe_path(const FfmpegProbe& ff, const std::string& path, const VideoOptions& options) {
  VideoInfo info;
  if (ff.ffprobe.empty()) return info;  // fps stays unknown (0)
  ProcessResult r = run_process(
      {ff.ffprobe, "-v", "error", "-select_streams", "v:0", "-count_packets", "-show_entries",
       "stream=width,height,avg_frame_rate,r_frame_rate,nb_frames,nb_read_packets", "-of", "json",
       path},
      {.timeout_s = options.timeout_s, .max_stdout_bytes = 1 << 20});
  METRALE_CHECK(r.exit_code == 0, "video: ffprobe cannot read the input (exit ", r.exit_code,
                "): ", r.err);
  nlohmann::json j = nlohmann::json::parse(r.out.begin(), r.out.end(), nullptr, false);
  METRALE_CHECK(!j.is_discarded() && j.contains("streams") && j["streams"].is_array(),
                "video: unreadable ffprobe output");
  METRALE_CHECK(!j["streams"].empty(), "video: the input has no video stream");
  const auto& s = j["streams"][0];
  auto str = [&](const char* key) {
    return s.contains(key) && s[key].is_string() ? s[key].get<std::string>() : std::string();
  };
  info.width = s.value("width", 0);
  info.height = s.value("height", 0);
  info.fps = parse_rate(str("avg_frame_rate"));
  if (info.fps <= 0) info.fps = parse_rate(str("r_frame_rate"));
  std::string frames = str("nb_frames");
  if (frames.empty()) frames = str("nb_read_packets");
  info.total_frames = std::atoll(frames.c_str());
  return info;
}

// Splits ffmpeg's concatenated PNGs at IEND and decodes each.
std::vector<Image> split_png_stream(std::span<const uint8_t> s, const DecodeLimits& limits) {
  std::vector<Image> frames;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    METRALE_CHECK(s.size() - pos >= 8 && std::memcmp(&s[pos], "\x89PNG\r\n\x1A\n", 8) == 0,
                  "video: ffmpeg output is not a PNG stream at byte ", pos);
    pos += 8;
    bool end = false;
    while (!end) {
      METRALE_CHECK(s.size() - pos >= 12, "video: ffmpeg output ends inside frame ", frames.size());
      const size_t len = size_t(s[pos]) << 24 | s[pos + 1] << 16 | s[pos + 2] << 8 | s[pos + 3];
      end = std::memcmp(&s[pos + 4], "IEND", 4) == 0;
      METRALE_CHECK(len <= s.size() - pos - 12, "video: ffmpeg output ends inside frame ",
                    frames.size());
      pos += 12 + len;
    }
    frames.push_back(detail::decode_png(s.subspan(start, pos - start), limits).image);
  }
  return frames;
}

VideoFrames decode_with_ffmpeg(const std::string& path, const VideoOptions& options) {
  const FfmpegProbe ff = require_ffmpeg();
  const VideoInfo info = probe_path(ff, path, options);
  std::vector<std::string> argv = {ff.ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error",
                                   "-i",      path,       "-map",         "0:v:0"};
  const auto& want = options.frame_indices;
  if (!want.empty()) {
    METRALE_CHECK(want.size() <= options.max_frames, "video: ", want.size(),
                  " frames requested, over the limit of ", options.max_frames);
    std::string expr = "select='";
    for (size_t i = 0; i < want.size(); ++i) {
      METRALE_CHECK(want[i] >= 0 && (i == 0 || want[i] > want[i - 1]),
                    "video: frame_indices must be ascending and non-negative; found ", want[i],
                    " at position ", i);
      expr += metrale::detail::concat(i ? "+" : "", "eq(n,", want[i], ")");
    }
    argv.insert(argv.end(), {"-vf", expr + "'"});
  }
  argv.insert(argv.end(),
              {"-fps_mode", "passthrough", "-frames:v", std::to_string(options.max_frames + 1),
               "-f", "image2pipe", "-vcodec", "png", "-pix_fmt", "rgb24", "-"});
  ProcessResult r = run_process(
      argv, {.timeout_s = options.timeout_s, .max_stdout_bytes = options.max_output_bytes});
  METRALE_CHECK(r.exit_code == 0, "video: ffmpeg cannot decode the input (exit ", r.exit_code,
                "): ", r.err.empty() ? std::string("no message") : r.err);
  VideoFrames out;
  out.frames = split_png_stream(r.out, options.limits);
  METRALE_CHECK(!out.frames.empty(), "video: ffmpeg decoded no frames; stderr: ", r.err);
  METRALE_CHECK(out.frames.size() <= options.max_frames, "video: more than ", options.max_frames,
                " frames; pass frame_indices to sample some");
  METRALE_CHECK(want.empty() || out.frames.size() == want.size(), "video: requested ", want.size(),
                " frames but the stream yielded ", out.frames.size(), " (indices past the end?)");
  out.fps = info.fps;
  out.total_frames = std::max<int64_t>(info.total_frames, want.empty() ? out.frames.size() : 0);
  for (size_t i = 0; i < out.frames.size(); ++i) out.indices.push_back(want.empty() ? i : want[i]);
  return out;
}

VideoFrames decode_gif_video(std::span<const uint8_t> bytes, const VideoOptions& options) {
  GifAnimation anim =
      decode_gif_frames(bytes, options.limits, options.max_frames + 1, options.max_output_bytes);
  METRALE_CHECK(anim.frames.size() <= options.max_frames, "video: GIF has more than ",
                options.max_frames, " frames");
  VideoFrames out;
  out.total_frames = int64_t(anim.frames.size());
  int64_t total_ms = 0;
  for (int d : anim.durations_ms) total_ms += d;
  // Browsers play zero-delay GIFs at 10 fps; use that when the file gives no timing.
  out.fps = total_ms > 0 ? 1000.0 * double(anim.frames.size()) / double(total_ms) : 10.0;
  for (int64_t i = 0; i < out.total_frames; ++i) {
    if (!options.frame_indices.empty() &&
        !std::binary_search(options.frame_indices.begin(), options.frame_indices.end(), i)) {
      continue;
    }
    out.frames.push_back(std::move(anim.frames[i]));
    out.indices.push_back(i);
    out.durations_ms.push_back(anim.durations_ms[i]);
  }
  METRALE_CHECK(options.frame_indices.empty() || out.frames.size() == options.frame_indices.size(),
                "video: requested ", options.frame_indices.size(), " frames but the GIF has ",
                out.total_frames);
  return out;
}

}  // namespace

bool is_gif(std::span<const uint8_t> bytes) { return sniff_format(bytes) == ImageFormat::kGif; }

VideoInfo probe_video(std::span<const uint8_t> bytes, const VideoOptions& options) {
  METRALE_CHECK(!bytes.empty(), "video: empty input (0 bytes)");
  if (is_gif(bytes)) {
    VideoFrames v = decode_gif_video(bytes, options);
    return {v.fps, v.total_frames, v.frames[0].width, v.frames[0].height};
  }
  const FfmpegProbe ff = require_ffmpeg();
  TempFile file(bytes);
  return probe_path(ff, file.path, options);
}

VideoFrames decode_video(std::span<const uint8_t> bytes, const VideoOptions& options) {
  METRALE_CHECK(!bytes.empty(), "video: empty input (0 bytes)");
  if (is_gif(bytes)) return decode_gif_video(bytes, options);
  require_ffmpeg();  // fail before writing a temporary file
  TempFile file(bytes);
  return decode_with_ffmpeg(file.path, options);
}

VideoFrames decode_video_file(const std::string& path, const VideoOptions& options) {
  std::vector<uint8_t> head(6);
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    METRALE_CHECK(fd >= 0, "video: cannot open ", path, ": ", std::strerror(errno));
    const ssize_t n = ::read(fd, head.data(), head.size());
    ::close(fd);
    head.resize(n > 0 ? size_t(n) : 0);
  }
  if (is_gif(head)) {
    std::vector<uint8_t> all;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    METRALE_CHECK(fd >= 0, "video: cannot open ", path, ": ", std::strerror(errno));
    uint8_t buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) all.insert(all.end(), buf, buf + n);
    ::close(fd);
    return with_context(path, [&] { return decode_gif_video(all, options); });
  }
  return with_context(path, [&] { return decode_with_ffmpeg(path, options); });
}

}  // namespace metrale::vision
