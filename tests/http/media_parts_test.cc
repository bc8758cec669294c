// Chat content parts with images and videos: the part shapes vLLM accepts, their rewrite to
// the template's {"type": "image"}, data: / file:// URLs, the file path policy (allowed
// directories only, no `..`, no symlink out), no network, and the byte limit; each refusal
// names the part.
#include "http/media_parts.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "http/openai_api.h"

namespace metrale::http {
namespace {

namespace fs = std::filesystem;

std::string error_of(const MediaPart& p, const MediaOptions& o) {
  try {
    read_media_part(p, o);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), p.where);
    return e.message();
  }
  return "";
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << text;
}

TEST(MediaParts, PartsAreTakenAndRewrittenForTheTemplate) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [
      {"type": "text", "text": "what is this?"},
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "high"}},
      {"type": "video_url", "video_url": {"url": "file:///v.mp4"}},
      {"image_url": "data:image/png;base64,BBBB"}]}])");
  const std::vector<MediaPart> parts = take_media_parts(messages);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].kind, vision::VisionKind::kImage);
  EXPECT_EQ(parts[0].url, "data:image/png;base64,AAAA");
  EXPECT_EQ(parts[0].where, "messages[1].content[1].image_url");
  EXPECT_EQ(parts[1].kind, vision::VisionKind::kVideo);
  EXPECT_EQ(parts[1].where, "messages[1].content[2].video_url");
  EXPECT_EQ(parts[2].url, "data:image/png;base64,BBBB");
  EXPECT_EQ(messages[1]["content"][1].dump(), R"({"type":"image"})");
  EXPECT_EQ(messages[1]["content"][2].dump(), R"({"type":"video"})");
  EXPECT_EQ(messages[1]["content"][0]["text"], "what is this?");

  nlohmann::ordered_json bad = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"uri": "x"}}]}])");
  try {
    take_media_parts(bad);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "messages[0].content[0].image_url");
    expect_has(e.message(), "expected {\"url\": a string}");
  }
}

TEST(MediaParts, ChatRequestsCarryTheirParts) {
  const OpenAiRequest r = parse_chat_request(R"({"messages": [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
      {"type": "text", "text": "hi"}]}]})");
  ASSERT_EQ(r.media.size(), 1u);
  EXPECT_EQ(r.media[0].where, "messages[0].content[0].image_url");
}

TEST(MediaParts, UrlsAndThePathPolicy) {
  const fs::path root = fs::temp_directory_path() / ("metrale_media_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "allowed" / "sub");
  fs::create_directories(root / "outside");
  std::ofstream(root / "allowed" / "sub" / "a b.png") << "PNGBYTES";
  std::ofstream(root / "outside" / "secret.png") << "SECRET";
  fs::create_symlink(root / "outside" / "secret.png", root / "allowed" / "link.png");
  MediaOptions o;
  o.allowed_dirs = canonical_media_dirs({(root / "allowed").string()});
  const std::string base = "file://" + (root / "allowed").string();
  auto part = [](std::string url) {
    return MediaPart{.url = std::move(url), .where = "messages[2].content[1].image_url"};
  };

  EXPECT_EQ(read_media_part(part(base + "/sub/a%20b.png"), o),
            std::vector<uint8_t>({'P', 'N', 'G', 'B', 'Y', 'T', 'E', 'S'}));
  const std::vector<uint8_t> decoded = read_media_part(part("data:image/png;base64,UE5H"), o);
  EXPECT_EQ(decoded, std::vector<uint8_t>({'P', 'N', 'G'}));

  expect_has(error_of(part(base + "/../outside/secret.png"), o), "may not contain '..'");
  expect_has(error_of(part(base + "/link.png"), o), "outside the directories");
  expect_has(error_of(part("file://" + (root / "outside" / "secret.png").string()), o),
             "outside the directories");
  expect_has(error_of(part(base + "/missing.png"), o), "cannot open");
  expect_has(error_of(part(base + "/sub"), o), "not a regular file");
  expect_has(error_of(part("file://relative.png"), o), "absolute path");
  expect_has(error_of(part("https://example.com/cat.png"), o), "http(s) URLs are not fetched");
  expect_has(error_of(part("http://example.com/cat.png"), o), "no network requests");
  expect_has(error_of(part("ftp://x"), o), "expected a data: or file:// URL");
  expect_has(error_of(part("data:image/png;base64,@@@@"), o), "messages[2].content[1].image_url");

  o.max_bytes = 4;
  expect_has(error_of(part(base + "/sub/a%20b.png"), o), "has 8 bytes; at most 4");
  expect_has(error_of(part("data:image/png;base64,UE5HUE5HUE5H"), o), "more than 4 bytes");

  MediaOptions none;
  expect_has(error_of(part(base + "/sub/a%20b.png"), none), "--allowed-media-dir");
  EXPECT_THROW(canonical_media_dirs({(root / "nope").string()}), Error);
  fs::remove_all(root);
}

}  // namespace
}  // namespace metrale::http
