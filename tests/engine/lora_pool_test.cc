// The LoRA slot pool: LRU eviction with references and pinning, "pool full", generations that
// expose stale references, a swap between decode steps while other sequences keep decoding,
// and bad adapters that leave the pool and every running sequence unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "engine/session.h"
#include "fixture_util.h"
#include "io/safetensors/file.h"
#include "io/safetensors/writer.h"
#include "support/test_support.h"

namespace metrale {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using testing::Reference;

const std::string kCase = "lora/qwen3_dense";

std::string adapter_dir(const std::string& a) { return testing::fixture_dir(kCase + "/" + a); }

std::unique_ptr<Model> base_model() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 256;
  return Model::load(testing::fixture_dir("qwen3_f32"), o);
}

// Greedy decoding of several sequences step by step, one step for all of them.
struct Decoder {
  Model& m;
  std::vector<float> logits;
  int32_t argmax(size_t row) const {
    const auto V = static_cast<size_t>(m.vocab_size());
    return static_cast<int32_t>(
        std::max_element(logits.begin() + row * V, logits.begin() + (row + 1) * V) -
        (logits.begin() + row * V));
  }
  // Prefills `ids` into `seq` and returns its first greedy token.
  int32_t start(Sequence& seq, std::span<const int32_t> ids) {
    logits.assign(static_cast<size_t>(m.vocab_size()), 0.0f);
    m.prefill(seq, ids, logits);
    return argmax(0);
  }
  // One decode step over `seqs` with `next`; next receives the new greedy tokens.
  void step(std::vector<Sequence*> seqs, std::vector<int32_t>& next) {
    logits.assign(seqs.size() * static_cast<size_t>(m.vocab_size()), 0.0f);
    m.decode(seqs, next, logits);
    for (size_t i = 0; i < seqs.size(); ++i) next[i] = argmax(i);
  }
};

TEST(LoraPool, SwapBetweenStepsWhileOthersKeepDecoding) {
  auto m = base_model();
  const Reference r(kCase);
  const std::vector<int32_t> ids = r.ids("input_ids");
  LoraPool& pool = m->enable_lora({.max_loras = 2, .max_rank = 16});
  pool.load("a", adapter_dir("a"));
  const LoraRef b_ref = pool.load("b", adapter_dir("b"));
  Decoder d{*m, {}};
  Sequence sa, sb, sc;
  m->set_adapter(sa, "a");
  m->set_adapter(sb, "b");
  std::vector<int32_t> got_a{d.start(sa, ids)}, got_b{d.start(sb, ids)}, got_c;
  std::vector<int32_t> next{got_a[0], got_b[0]};
  for (int i = 0; i < 5; ++i) {
    d.step({&sa, &sb}, next);
    got_a.push_back(next[0]);
    got_b.push_back(next[1]);
  }
  // b finishes; c takes its slot (the LRU one without references), while a keeps decoding.
  m->release(sb);
  pool.load("c", adapter_dir("c"));
  EXPECT_FALSE(pool.loaded("b"));
  EXPECT_EQ(pool.slots()[static_cast<size_t>(b_ref.slot)].name, "c");
  EXPECT_NE(pool.slots()[static_cast<size_t>(b_ref.slot)].generation, b_ref.generation);
  // b's old reference is stale: refused, never served with c's weights.
  EXPECT_NE(error_of([&] { pool.check(b_ref); }).find("stale"), std::string::npos);
  Sequence stale;
  stale.lora = b_ref;
  std::vector<float> one(static_cast<size_t>(m->vocab_size()));
  EXPECT_NE(error_of([&] { m->prefill(stale, ids, one); }).find("stale"), std::string::npos);
  EXPECT_TRUE(stale.tokens.empty());

  m->set_adapter(sc, "c");
  got_c.push_back(d.start(sc, ids));
  next = {got_a.back(), got_c[0]};
  while (got_a.size() < 16 || got_c.size() < 16) {
    d.step({&sa, &sc}, next);
    if (got_a.size() < 16) got_a.push_back(next[0]);
    if (got_c.size() < 16) got_c.push_back(next[1]);
  }
  EXPECT_EQ(got_a, r.ids("a.greedy_ids"));
  const std::vector<int32_t> want_b = r.ids("b.greedy_ids");
  EXPECT_EQ(got_b, std::vector<int32_t>(want_b.begin(), want_b.begin() + 6));
  EXPECT_EQ(got_c, r.ids("c.greedy_ids"));
  m->release(sa);
  m->release(sc);
}

TEST(LoraPool, VictimIsEmptyThenLeastRecentlyUsedUnreferencedElseFull) {
  auto m = base_model();
  LoraPool& pool = m->enable_lora({.max_loras = 3, .max_rank = 16});
  const LoraRef a = pool.load("a", adapter_dir("a"), /*pinned=*/true);
  const LoraRef b = pool.load("b", adapter_dir("b"));
  EXPECT_EQ(a.slot, 0);
  EXPECT_EQ(b.slot, 1);
  // The third load takes the empty slot.
  EXPECT_EQ(pool.load("c", adapter_dir("c")).slot, 2);
  // Full now: b is the least recently used unpinned, unreferenced one; using b makes c the LRU.
  Sequence s;
  m->set_adapter(s, "b");
  m->release(s);
  pool.unload("c");
  EXPECT_EQ(pool.load("c", adapter_dir("c")).slot, 2);  // the freed slot first
  pool.acquire("c");                                    // c: used most recently, referenced
  const LoraRef b_again = pool.acquire("b");
  pool.release(b_again);  // b: used after c, no references
  // Loading a 4th: a pinned, c referenced -> b goes.
  const LoraRef d = pool.load("d", adapter_dir("a"));
  EXPECT_EQ(d.slot, b.slot);
  EXPECT_FALSE(pool.loaded("b"));
  // Now a pinned, c referenced, d unreferenced: d is the only victim; reference it too and the
  // pool is full, with a message naming every slot; nothing changes.
  pool.acquire("d");
  const std::string err = error_of([&] { pool.load("e", adapter_dir("b")); });
  EXPECT_NE(err.find("pool full"), std::string::npos) << err;
  EXPECT_NE(err.find("a (pinned)"), std::string::npos) << err;
  EXPECT_FALSE(pool.loaded("e"));
  EXPECT_TRUE(pool.loaded("a") && pool.loaded("c") && pool.loaded("d"));
  // A referenced adapter cannot be unloaded; a name loads once.
  EXPECT_NE(error_of([&] { pool.unload("c"); }).find("in use"), std::string::npos);
  EXPECT_NE(error_of([&] { pool.load("a", adapter_dir("a")); }).find("already loaded"),
            std::string::npos);
}

TEST(LoraPool, RankAboveTheMaxIsRefused) {
  auto m = base_model();
  LoraPool& pool = m->enable_lora({.max_loras = 2, .max_rank = 8});
  pool.load("a", adapter_dir("a"));                                             // rank 8 fits
  const std::string err = error_of([&] { pool.load("c", adapter_dir("c")); });  // rank 16
  EXPECT_NE(err.find("rank 16 exceeds the LoRA pool's max rank 8"), std::string::npos) << err;
  EXPECT_NE(err.find("lora_A.weight"), std::string::npos) << err;
  EXPECT_FALSE(pool.loaded("c"));
}

// --- bad adapters: each refused naming the key or field; the pool and a running sequence
// unchanged ---

// A scratch copy of fixture adapter `a`, edited by a test.
class AdapterCopy {
 public:
  explicit AdapterCopy(const std::string& from = "a") {
    for (const auto& e : fs::directory_iterator(adapter_dir(from)))
      fs::copy_file(e.path(), dir_.path() / e.path().filename());
  }
  fs::path dir() const { return dir_.path(); }
  fs::path tensors() const { return dir() / "adapter_model.safetensors"; }
  // Rewrites the tensors through edit(name, values) -> keep? (values may be changed).
  void rewrite(const std::function<bool(const std::string&, std::vector<float>&)>& edit) {
    SafetensorsWriter w;
    {
      const SafetensorsFile f = SafetensorsFile::open(tensors());
      for (const SafetensorsTensorInfo& t : f.tensors()) {
        std::vector<float> v(static_cast<size_t>(t.shape.numel()));
        std::memcpy(v.data(), f.bytes(t).data(), v.size() * sizeof(float));
        if (!edit(t.name, v)) continue;
        w.add(t.name, DType::kF32, t.shape,
              {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)});
      }
    }
    w.write(tensors());
  }
  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir() / "adapter_config.json"));
    edit(j);
    std::ofstream(dir() / "adapter_config.json") << j.dump();
  }

 private:
  test::ScratchDir dir_;
};

class LoraBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = base_model();
    pool_ = &m_->enable_lora({.max_loras = 3, .max_rank = 16});
    pool_->load("a", adapter_dir("a"));
    m_->set_adapter(seq_, "a");
    ids_ = Reference(kCase).ids("input_ids");
    std::vector<float> logits(static_cast<size_t>(m_->vocab_size()));
    m_->prefill(seq_, std::span(ids_).first(6), logits);
  }
  // The error of loading `dir`; afterwards the pool holds just "a" and seq_ continues exactly
  // as an undisturbed run would.
  std::string refused(const fs::path& dir) {
    const std::string err = error_of([&] { pool_->load("bad", dir); });
    EXPECT_FALSE(pool_->loaded("bad"));
    EXPECT_TRUE(pool_->loaded("a"));
    std::vector<float> logits(static_cast<size_t>(m_->vocab_size()));
    m_->prefill(seq_, std::span(ids_).subspan(6), logits, /*all_logits=*/false);
    const std::vector<float> want = Reference(kCase).floats("a.logits");
    const size_t V = logits.size();
    EXPECT_LT(testing::max_abs_diff(logits.data(), want.data() + (ids_.size() - 1) * V, V), 1e-4f);
    m_->truncate(seq_, 6);
    return err;
  }
  std::unique_ptr<Model> m_;
  LoraPool* pool_ = nullptr;
  Sequence seq_;
  std::vector<int32_t> ids_;
};

TEST_F(LoraBadInput, AdapterForAnotherModel) {
  // qwen2_overlays' adapter: v_proj is [32, 8] there (qwen2 has 2 kv heads of 16), 64 here.
  AdapterCopy c("../qwen2_overlays/tok");
  const std::string err = refused(c.dir());
  EXPECT_NE(err.find("has shape"), std::string::npos) << err;
  EXPECT_NE(err.find("lora_B.weight"), std::string::npos) << err;
}

TEST_F(LoraBadInput, MissingHalfOfAPair) {
  AdapterCopy c;
  c.rewrite([](const std::string& n, std::vector<float>&) {
    return n != "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight";
  });
  const std::string err = refused(c.dir());
  EXPECT_NE(err.find("model.layers.1.mlp.up_proj.lora_A.weight' has no lora_B partner"),
            std::string::npos)
      << err;
}

TEST_F(LoraBadInput, TargetWithoutTensors) {
  AdapterCopy c;
  c.rewrite([](const std::string& n, std::vector<float>&) {
    return n.find("layers.2.self_attn.k_proj") == std::string::npos;
  });
  const std::string err = refused(c.dir());
  EXPECT_NE(err.find("targets module 'model.layers.2.self_attn.k_proj' but the file has no"),
            std::string::npos)
      << err;
}

TEST_F(LoraBadInput, NonFiniteWeights) {
  for (float bad : {std::nanf(""), INFINITY}) {
    AdapterCopy c;
    c.rewrite([&](const std::string& n, std::vector<float>& v) {
      if (n == "base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight") v[5] = bad;
      return true;
    });
    const std::string err = refused(c.dir());
    EXPECT_NE(err.find("layers.0.self_attn.o_proj.lora_A.weight' holds a non-finite value"),
              std::string::npos)
        << err;
  }
}

TEST_F(LoraBadInput, TruncatedFile) {
  AdapterCopy c;
  fs::resize_file(c.tensors(), fs::file_size(c.tensors()) - 100);
  const std::string err = refused(c.dir());
  EXPECT_NE(err.find("adapter_model.safetensors"), std::string::npos) << err;
}

TEST_F(LoraBadInput, DuplicatedKey) {
  AdapterCopy c;
  // Rewrite the header with one key twice (same offsets): the strict parser refuses it.
  std::vector<uint8_t> bytes = test::read_file(c.tensors().string());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  const std::string key = "\"base_model.model.model.layers.0.mlp.down_proj.lora_A.weight\"";
  const size_t at = header.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t end = header.find('}', at) + 1;
  header.insert(end, "," + header.substr(at, end - at));
  while (header.size() % 8) header += ' ';
  const uint64_t m = header.size();
  std::ofstream out(c.tensors(), std::ios::binary);
  out.write(reinterpret_cast<const char*>(&m), 8);
  out << header;
  out.write(reinterpret_cast<const char*>(bytes.data()) + 8 + n,
            static_cast<std::streamsize>(bytes.size() - 8 - n));
  out.close();
  const std::string err = refused(c.dir());
  EXPECT_NE(err.find("duplicate key"), std::string::npos) << err;
}

TEST_F(LoraBadInput, UnknownKeyAndUnknownModule) {
  {
    AdapterCopy c;
    SafetensorsWriter w;
    {
      const SafetensorsFile f = SafetensorsFile::open(c.tensors());
      for (const SafetensorsTensorInfo& t : f.tensors()) {
        std::string name = t.name;
        if (name.find("layers.0.self_attn.q_proj") != std::string::npos)
          name.replace(name.find("q_proj"), 6, "qq_proj");
        w.add(name, t.dtype, t.shape, f.bytes(t));
      }
    }
    w.write(c.tensors());
    const std::string err = refused(c.dir());
    EXPECT_NE(err.find("no module 'model.layers.0.self_attn.qq_proj'"), std::string::npos) << err;
  }
  {
    AdapterCopy c;
    c.edit_config([](nlohmann::json& j) { j["target_modules"].push_back("w_proj"); });
    const std::string err = refused(c.dir());
    EXPECT_NE(err.find("'w_proj' matches no module"), std::string::npos) << err;
  }
}

TEST_F(LoraBadInput, ConfigThatChangesTheMath) {
  const std::vector<std::pair<std::string, nlohmann::json>> edits = {
      {"use_dora", true}, {"peft_type", "IA3"}, {"fan_in_fan_out", true}, {"bias", "all"}};
  for (const auto& [key, value] : edits) {
    AdapterCopy c;
    c.edit_config([&](nlohmann::json& j) { j[key] = value; });
    const std::string err = refused(c.dir());
    EXPECT_NE(err.find("adapter_config.json: field '" + key + "'"), std::string::npos) << err;
  }
  // A rank that contradicts the tensors.
  AdapterCopy c;
  c.edit_config([](nlohmann::json& j) { j["r"] = 4; });
  const std::string err = refused(c.dir());
  EXPECT_NE(err.find("expected [4, 64]"), std::string::npos) << err;
}

}  // namespace
}  // namespace metrale
