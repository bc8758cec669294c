// Video decoding: GIF animations against PIL's frames, ffmpeg-decoded clips against the
// frames the same ffmpeg produced at fixture time (raw rgb24, compared exactly: the fixture
// script and this test run one ffmpeg binary; a different ffmpeg build could differ by a
// few levels, which the tolerance-free comparison would then flag).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"
#include "vision/gif_frames.h"
#include "vision/video.h"

namespace metrale::vision {
namespace {

using test::read_file;

nlohmann::json manifest() {
  std::ifstream f("tests/data/vision/decoded/manifest.json");
  return nlohmann::json::parse(f);
}

void expect_frames_equal(const VideoFrames& got, const std::vector<uint8_t>& want, int w, int h,
                         const std::vector<int64_t>& indices) {
  const size_t frame_bytes = size_t(w) * h * 3;
  ASSERT_EQ(got.frames.size(), indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    SCOPED_TRACE("frame " + std::to_string(indices[i]));
    ASSERT_EQ(got.frames[i].width, w);
    ASSERT_EQ(got.frames[i].height, h);
    ASSERT_LE((indices[i] + 1) * frame_bytes, want.size());
    const std::vector<uint8_t> ref(want.begin() + indices[i] * frame_bytes,
                                   want.begin() + (indices[i] + 1) * frame_bytes);
    size_t mismatches = 0;
    for (size_t b = 0; b < frame_bytes; ++b) mismatches += got.frames[i].rgb[b] != ref[b];
    EXPECT_EQ(mismatches, 0u);
    EXPECT_EQ(got.indices[i], indices[i]);
  }
}

std::vector<int64_t> all(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(GifVideo, FramesMatchPilIteration) {
  const auto m = manifest();
  ASSERT_GE(m["gif_animations"].size(), 2u);
  for (const auto& e : m["gif_animations"]) {
    SCOPED_TRACE(e["image"].get<std::string>());
    const auto bytes = read_file(e["image"]);
    const VideoFrames v = decode_video(bytes);
    const int n = e["frames"];
    EXPECT_EQ(v.total_frames, n);
    expect_frames_equal(v, read_file(e["reference"]), e["width"], e["height"], all(n));
    EXPECT_EQ(v.durations_ms, e["durations_ms"].get<std::vector<int>>());
    int total_ms = 0;
    for (int d : v.durations_ms) total_ms += d;
    EXPECT_DOUBLE_EQ(v.fps, 1000.0 * n / total_ms);
  }
}

TEST(GifVideo, SelectsFramesAndEnforcesLimits) {
  const auto e = manifest()["gif_animations"][0];
  const auto bytes = read_file(e["image"]);
  VideoOptions pick{.frame_indices = {1, 3}};
  const VideoFrames v = decode_video(bytes, pick);
  expect_frames_equal(v, read_file(e["reference"]), e["width"], e["height"], {1, 3});
  EXPECT_THROW(decode_video(bytes, VideoOptions{.max_frames = 2}), Error);
  EXPECT_THROW(decode_video(bytes, VideoOptions{.frame_indices = {99}}), Error);
  EXPECT_THROW(decode_video(bytes, VideoOptions{.max_output_bytes = 1000}), Error);
  // The first frame of an animation is also what decode_image() returns.
  const Image still = decode_image(bytes);
  expect_frames_equal(VideoFrames{.frames = {still}, .indices = {0}}, read_file(e["reference"]),
                      e["width"], e["height"], {0});
}

TEST(FfmpegVideo, ClipsMatchFfmpegFrames) {
  const auto m = manifest();
  ASSERT_GE(m["videos"].size(), 2u);
  for (const auto& e : m["videos"]) {
    SCOPED_TRACE(e["video"].get<std::string>());
    const auto bytes = read_file(e["video"]);
    const int n = e["frames"];
    const VideoFrames v = decode_video(bytes);
    EXPECT_DOUBLE_EQ(v.fps, e["fps"].get<double>());
    EXPECT_EQ(v.total_frames, n);
    const auto ref = read_file(e["reference"]);
    expect_frames_equal(v, ref, e["width"], e["height"], all(n));

    const VideoFrames some = decode_video(bytes, VideoOptions{.frame_indices = {0, 7, n - 1}});
    EXPECT_EQ(some.total_frames, n);
    expect_frames_equal(some, ref, e["width"], e["height"], {0, 7, n - 1});

    const VideoFrames from_path = decode_video_file(e["video"]);
    EXPECT_EQ(from_path.frames.size(), size_t(n));

    const VideoInfo info = probe_video(bytes);
    EXPECT_EQ(info.width, e["width"].get<int>());
    EXPECT_EQ(info.height, e["height"].get<int>());
    EXPECT_EQ(info.total_frames, n);
  }
}

TEST(FfmpegVideo, BadInputsGiveErrors) {
  const auto bytes = read_file("tests/data/vision/videos/not_a_video.mp4");
  try {
    decode_video(bytes);
    FAIL() << "decoded garbage";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("video:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decode_video({}), Error);
  const auto clip = read_file("tests/data/vision/videos/clip_h264.mp4");
  EXPECT_THROW(decode_video(std::span(clip.data(), clip.size() / 2)), Error);
  EXPECT_THROW(decode_video(clip, VideoOptions{.max_frames = 5}), Error);
  EXPECT_THROW(decode_video(clip, VideoOptions{.frame_indices = {3, 2}}), Error);
  EXPECT_THROW(decode_video(clip, VideoOptions{.frame_indices = {500}}), Error);
  EXPECT_THROW(decode_video(clip, VideoOptions{.max_output_bytes = 5000}), Error);
  EXPECT_THROW(decode_video_file("tests/data/vision/videos/does_not_exist.mp4"), Error);
}

}  // namespace
}  // namespace metrale::vision
