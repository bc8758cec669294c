// ffmpeg discovery and the child-process guard rails: disabled / missing binaries, a hung
// ffmpeg (a fake script that sleeps) killed by the timeout, output caps, failing exits.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>

#include "core/error.h"
#include "vision/ffmpeg.h"
#include "vision/video.h"

namespace metrale::vision {
namespace {

// Sets METRALE_FFMPEG for one test and restores it afterwards.
class FfmpegEnv {
 public:
  explicit FfmpegEnv(const char* value) {
    const char* old = std::getenv("METRALE_FFMPEG");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr)
      ::setenv("METRALE_FFMPEG", value, 1);
    else
      ::unsetenv("METRALE_FFMPEG");
  }
  ~FfmpegEnv() {
    if (had_)
      ::setenv("METRALE_FFMPEG", old_.c_str(), 1);
    else
      ::unsetenv("METRALE_FFMPEG");
  }

 private:
  bool had_ = false;
  std::string old_;
};

// A fake ffmpeg script in a fresh temporary directory, removed afterwards.
class FakeFfmpeg {
 public:
  explicit FakeFfmpeg(const std::string& body) {
    char dir[] = "/tmp/metrale-fake-ffmpeg-XXXXXX";
    EXPECT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/ffmpeg";
    std::ofstream(path_) << "#!/bin/sh\n" << body << "\n";
    ::chmod(path_.c_str(), 0755);
  }
  ~FakeFfmpeg() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const char* path() const { return path_.c_str(); }

 private:
  std::string dir_, path_;
};

const std::vector<uint8_t> kNotGif = {0, 0, 0, 0x18, 'f', 't', 'y', 'p', 'm', 'p', '4', '2'};

TEST(Ffmpeg, ProbeFindsTheInstalledBinary) {
  FfmpegEnv env(nullptr);
  const FfmpegProbe p = ffmpeg_probe();
  ASSERT_EQ(p.state, FfmpegState::kReady) << p.detail;
  EXPECT_NE(p.detail.find("ffmpeg version"), std::string::npos) << p.detail;
  EXPECT_FALSE(p.ffprobe.empty());
}

TEST(Ffmpeg, DisabledByEnvironment) {
  FfmpegEnv env("0");
  EXPECT_EQ(ffmpeg_probe().state, FfmpegState::kDisabled);
  try {
    decode_video(kNotGif);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("METRALE_FFMPEG=0"), std::string::npos) << e.what();
  }
}

TEST(Ffmpeg, MissingBinaryIsAClearError) {
  FfmpegEnv env("/nonexistent/bin/ffmpeg");
  const FfmpegProbe p = ffmpeg_probe();
  EXPECT_EQ(p.state, FfmpegState::kMissing);
  try {
    decode_video(kNotGif);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs ffmpeg"), std::string::npos) << e.what();
  }
}

TEST(Ffmpeg, HungFfmpegIsKilledByTheTimeout) {
  FakeFfmpeg fake("sleep 30");
  FfmpegEnv env(fake.path());
  const auto start = std::chrono::steady_clock::now();
  try {
    decode_video(kNotGif, VideoOptions{.timeout_s = 0.3});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
  // A guard against hanging, not a performance assertion: the script would sleep 30 s.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(ffmpeg_probe(0.3).state, FfmpegState::kMissing);
}

TEST(Ffmpeg, FailingFfmpegReportsItsStderr) {
  FakeFfmpeg fake("echo 'moov atom not found' >&2; exit 3");
  FfmpegEnv env(fake.path());
  try {
    decode_video(kNotGif);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moov atom not found"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exit 3"), std::string::npos) << e.what();
  }
}

TEST(RunProcess, CapsOutputAndReportsExitCodes) {
  EXPECT_THROW(
      run_process({"/bin/sh", "-c", "head -c 100000 /dev/zero"}, {.max_stdout_bytes = 1000}),
      Error);
  const ProcessResult ok = run_process({"/bin/sh", "-c", "printf abc; echo err >&2; exit 4"}, {});
  EXPECT_EQ(std::string(ok.out.begin(), ok.out.end()), "abc");
  EXPECT_EQ(ok.err, "err\n");
  EXPECT_EQ(ok.exit_code, 4);
  EXPECT_THROW(run_process({"/nonexistent/binary"}, {}), Error);
  EXPECT_THROW(run_process({}, {}), Error);
}

}  // namespace
}  // namespace metrale::vision
