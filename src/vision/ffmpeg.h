#pragma once
// Running ffmpeg/ffprobe as child processes: posix_spawn with an argv (never a shell), in
// their own process group, stdin from /dev/null, stdout/stderr drained by poll() under a
// deadline (the whole group is SIGKILLed when it passes) and an output cap.
//
// METRALE_FFMPEG selects the binary: unset -> "ffmpeg" on PATH, "0" -> disabled,
// anything else -> that path. ffprobe is looked up next to a selected ffmpeg, else on PATH
// (METRALE_FFPROBE overrides).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace metrale::vision {

enum class FfmpegState { kReady, kMissing, kDisabled };

struct FfmpegProbe {
  FfmpegState state = FfmpegState::kMissing;
  std::string ffmpeg;   // binary that would run
  std::string ffprobe;  // may be empty when none is found
  std::string detail;   // why it is missing / disabled, or ffmpeg's version line
};

// Finds the binaries without running them: kReady here only means "an executable is there".
FfmpegProbe resolve_ffmpeg();

// resolve_ffmpeg() + a `ffmpeg -version` run: kReady means videos can be decoded. The
// timeout only guards against a hung binary: Debian's ffmpeg links about 200 shared
// libraries, and its first start on a cold machine (pages not yet cached, other processes
// reading the disk) has been seen to take over 10 s, so the default is generous.
FfmpegProbe ffmpeg_probe(double timeout_s = 60.0);

struct ProcessOptions {
  double timeout_s = 60.0;
  size_t max_stdout_bytes = size_t(1) << 30;
  size_t max_stderr_bytes = 64 * 1024;  // keep the tail only
};

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed by a signal
  std::vector<uint8_t> out;
  std::string err;
};

// Spawns argv[0] (searched on PATH when it has no '/'). Throws metrale::Error when the
// binary cannot start, on timeout (after killing it) or when stdout exceeds its cap; a
// non-zero exit is returned, not thrown, so callers can add context.
ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options);

}  // namespace metrale::vision
