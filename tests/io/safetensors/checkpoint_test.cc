// Checkpoint: single file, indexed shards, the all-files fallback, and their failures.
#include "io/safetensors/checkpoint.h"

#include <gtest/gtest.h>

#include "io/safetensors/writer.h"
#include "test_util.h"

namespace metrale {
namespace {

using test::error_of;
using test::ScratchDir;

std::vector<std::byte> bytes_of(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 17 + static_cast<size_t>(seed)) & 0xff);
  return v;
}

// Writes a shard holding `names`, each a U8 tensor of (index + 1) * 3 bytes.
void write_shard(const std::filesystem::path& path, std::initializer_list<const char*> names) {
  SafetensorsWriter w;
  int seed = 0;
  for (const char* n : names) {
    const size_t len = std::string(n).size() * 3;
    w.add(n, DType::kU8, Shape{static_cast<int64_t>(len)}, bytes_of(len, seed++));
  }
  w.write(path);
}

void expect_has(const std::string& msg, std::initializer_list<const char*> words) {
  for (const char* w : words)
    EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
}
void expect_has(const std::string& msg, const std::vector<const char*>& words) {
  for (const char* w : words)
    EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
}

constexpr const char* kIndex = "model.safetensors.index.json";

TEST(Checkpoint, SingleFile) {
  ScratchDir dir;
  write_shard(dir / "model.safetensors", {"b", "a", "ccc"});
  write_shard(dir / "other.safetensors", {"zzz"});  // ignored: model.safetensors wins
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.layout(), Checkpoint::Layout::kSingleFile);
  ASSERT_EQ(ck.tensors().size(), 3u);
  EXPECT_EQ(ck.tensors()[0].name(), "a");
  EXPECT_EQ(ck.tensors()[2].name(), "ccc");
  EXPECT_EQ(ck.total_bytes(), 3u + 3u + 9u);
  EXPECT_EQ(ck.find("zzz"), nullptr);
  EXPECT_TRUE(ck.warnings().empty());
}

TEST(Checkpoint, IndexedShards) {
  ScratchDir dir;
  write_shard(dir / "model-00001-of-00002.safetensors", {"layer.0.w", "embed"});
  write_shard(dir / "model-00002-of-00002.safetensors", {"layer.1.w", "head", "stale"});
  test::write_text(dir / kIndex, R"({"metadata": {"total_size": 123},
    "weight_map": {"embed": "model-00001-of-00002.safetensors",
                   "layer.0.w": "model-00001-of-00002.safetensors",
                   "layer.1.w": "model-00002-of-00002.safetensors",
                   "head": "model-00002-of-00002.safetensors"}})");
  Checkpoint moved = Checkpoint::open(dir.path());
  const Checkpoint ck = std::move(moved);  // pointers into files survive the move
  EXPECT_EQ(ck.layout(), Checkpoint::Layout::kIndexed);
  EXPECT_EQ(ck.files().size(), 2u);
  std::vector<std::string> names;
  for (const auto& t : ck.tensors()) names.emplace_back(t.name());
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "head", "layer.0.w", "layer.1.w"}));
  EXPECT_EQ(ck.total_bytes(), (5u + 4u + 9u + 9u) * 3u);
  const auto& head = ck.at("head");
  EXPECT_NE(head.file->path().find("00002-of-00002"), std::string::npos);
  EXPECT_EQ(head.bytes().size(), 12u);
  EXPECT_EQ(head.view().shape, Shape({12}));

  // The unlisted tensor is reported, not exposed.
  ASSERT_EQ(ck.warnings().size(), 1u);
  expect_has(ck.warnings()[0], {"'stale'", "not listed", "ignored"});
  EXPECT_EQ(ck.find("stale"), nullptr);

  std::vector<std::byte> dst(12);
  ck.copy_to("head", dst);
  EXPECT_TRUE(std::equal(dst.begin(), dst.end(), head.bytes().begin()));
  const std::string msg = error_of([&] { ck.at("nope"); });
  expect_has(msg, {dir.path().string().c_str(), "no tensor named 'nope'"});
}

TEST(Checkpoint, IndexMissingShard) {
  ScratchDir dir;
  write_shard(dir / "a.safetensors", {"x"});
  test::write_text(dir / kIndex,
                   R"({"weight_map": {"x": "a.safetensors", "y": "gone.safetensors"}})");
  expect_has(error_of([&] { Checkpoint::open(dir.path()); }),
             {kIndex, "1 tensor(s) (e.g. 'y')", "'gone.safetensors'", "does not exist"});
}

TEST(Checkpoint, IndexPointsAtMissingTensor) {
  ScratchDir dir;
  write_shard(dir / "a.safetensors", {"x"});
  test::write_text(dir / kIndex, R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})");
  expect_has(error_of([&] { Checkpoint::open(dir.path()); }),
             {kIndex, "maps tensor 'y' to 'a.safetensors'", "no such tensor"});
}

TEST(Checkpoint, BadIndexFiles) {
  ScratchDir dir;
  write_shard(dir / "a.safetensors", {"x"});
  // A vector, not an initializer_list: a list member of an array element would dangle.
  const std::pair<const char*, std::vector<const char*>> cases[] = {
      {"not json", {kIndex, "not valid JSON"}},
      {"[]", {kIndex, "expected a JSON object", "found array"}},
      {R"({"metadata": {}})", {kIndex, "missing required field 'weight_map'"}},
      {R"({"weight_map": ["a.safetensors"]})",
       {"field 'weight_map': expected an object", "found array"}},
      {R"({"weight_map": {}})", {"weight_map is empty"}},
      {R"({"weight_map": {"x": 3}})",
       {"field 'weight_map.x': expected a file name string", "found 3"}},
      {R"({"weight_map": {"x": "../a.safetensors"}})",
       {"field 'weight_map.x'", "plain file name", "found '../a.safetensors'"}},
      {R"({"weight_map": {"model.norm.weight": 3}})", {"field 'weight_map['model.norm.weight']'"}},
      {R"({"weight_map": {"x": "a.safetensors", "x": "a.safetensors"}})",
       {"duplicate key 'x' inside 'weight_map'"}},
  };
  for (const auto& [text, words] : cases) {
    SCOPED_TRACE(text);
    test::write_text(dir / kIndex, text);
    expect_has(error_of([&] { Checkpoint::open(dir.path()); }), words);
  }
}

TEST(Checkpoint, BadShardNamesItsFile) {
  ScratchDir dir;
  test::write_bytes(dir / "a.safetensors",
                    test::raw_file(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,9]}})", 9));
  test::write_text(dir / kIndex, R"({"weight_map": {"x": "a.safetensors"}})");
  expect_has(error_of([&] { Checkpoint::open(dir.path()); }),
             {"a.safetensors: tensor 'x'", "= 4 bytes", "span 9 bytes"});
}

TEST(Checkpoint, AllFilesFallback) {
  ScratchDir dir;
  write_shard(dir / "consolidated-2.safetensors", {"q", "b"});
  write_shard(dir / "consolidated-1.safetensors", {"a"});
  test::write_text(dir / "config.json", "{}");
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.layout(), Checkpoint::Layout::kAllFiles);
  ASSERT_EQ(ck.files().size(), 2u);
  EXPECT_NE(ck.files()[0].path().find("consolidated-1"), std::string::npos);  // sorted by name
  ASSERT_EQ(ck.tensors().size(), 3u);
  EXPECT_EQ(ck.tensors()[0].name(), "a");
  EXPECT_EQ(ck.tensors()[1].name(), "b");
  EXPECT_EQ(ck.tensors()[2].name(), "q");
  EXPECT_EQ(ck.total_bytes(), 9u);

  write_shard(dir / "consolidated-3.safetensors", {"b"});
  expect_has(
      error_of([&] { Checkpoint::open(dir.path()); }),
      {"tensor 'b' appears in both", "consolidated-2.safetensors", "consolidated-3.safetensors"});
}

TEST(Checkpoint, NothingToOpen) {
  ScratchDir dir;
  expect_has(error_of([&] { Checkpoint::open(dir.path()); }),
             {"no model.safetensors", "*.safetensors"});
  expect_has(error_of([&] { Checkpoint::open(dir / "absent"); }),
             {"absent", "not a directory", "does not exist"});
  test::write_text(dir / "file", "x");
  expect_has(error_of([&] { Checkpoint::open(dir / "file"); }), {"not a directory"});
}

TEST(Checkpoint, EmptyModelFile) {
  ScratchDir dir;
  test::write_bytes(dir / "model.safetensors", {});
  expect_has(error_of([&] { Checkpoint::open(dir.path()); }),
             {"model.safetensors: file is 0 bytes"});
}

}  // namespace
}  // namespace metrale
