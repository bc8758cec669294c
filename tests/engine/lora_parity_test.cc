// LoRA adapters against PEFT 0.21 (tests/data/fixtures/lora, tools/fixtures/models/
// lora_fixtures.py): every adapter alone (logits and a 16-token greedy continuation), PEFT's
// mixed batch (rows of different adapters and the base model in one pass), all adapters of a
// case decoding together, and the bf16 slot storage.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "engine/session.h"
#include "fixture_util.h"
#include "io/safetensors/file.h"

namespace metrale {
namespace {

using testing::Reference;

struct Case {
  const char* name;  // tests/data/fixtures/lora/<name>
  const char* base;  // the base checkpoint fixture
  std::vector<std::string> adapters;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// f32 on O(1) logits: PEFT and metrale sum in different orders (1e-5 seen).
constexpr float kTol = 1e-4f;

class LoraParity : public ::testing::TestWithParam<Case> {
 protected:
  std::string dir(const std::string& adapter) const {
    return testing::fixture_dir(std::string("lora/") + GetParam().name + "/" + adapter);
  }
  Reference ref() const { return Reference(std::string("lora/") + GetParam().name); }
  // The base model with every adapter of the case loaded (pinned) into one pool.
  std::unique_ptr<Model> load(DType dtype = DType::kF32, int threads = 2) const {
    LoadOptions o;
    o.n_threads = threads;
    o.kv_tokens = 256;
    // A fixture under tests/data/fixtures, or the demo checkpoint (models/demo).
    const std::string base = GetParam().base;
    auto m = Model::load(base.starts_with("models/") ? base : testing::fixture_dir(base), o);
    LoraPool& pool = m->enable_lora({.max_loras = static_cast<int64_t>(GetParam().adapters.size()),
                                     .max_rank = 16,
                                     .dtype = dtype});
    for (const std::string& a : GetParam().adapters) pool.load(a, dir(a), /*pinned=*/true);
    return m;
  }
  std::vector<std::string> mixed_names() const {
    const SafetensorsFile f = SafetensorsFile::open(
        testing::fixture_dir(std::string("lora/") + GetParam().name) + "/reference.safetensors");
    std::vector<std::string> names = nlohmann::json::parse(f.metadata().at("mixed_adapter_names"));
    for (std::string& n : names)
      if (n == "__base__") n.clear();
    return names;
  }
};

TEST_P(LoraParity, EachAdapterAloneMatchesPeftLogits) {
  auto m = load();
  const Reference r = ref();
  const std::vector<int32_t> ids = r.ids("input_ids");
  const auto n = static_cast<int64_t>(ids.size());
  std::vector<std::string> all = GetParam().adapters;
  all.push_back("");  // and the base model, through the same pool
  for (const std::string& a : all) {
    Sequence seq;
    m->set_adapter(seq, a);
    std::vector<float> logits(static_cast<size_t>(n * m->vocab_size()));
    m->prefill(seq, ids, logits, /*all_logits=*/true);
    m->release(seq);
    const std::vector<float> want = r.floats((a.empty() ? "base" : a) + ".logits");
    ASSERT_EQ(want.size(), logits.size());
    EXPECT_LT(testing::max_abs_diff(logits.data(), want.data(), want.size()), kTol)
        << "adapter '" << a << "'";
  }
}

TEST_P(LoraParity, GreedyContinuationsMatchPeftAloneAndBatched) {
  auto m = load();
  const Reference r = ref();
  const std::vector<int32_t> ids = r.ids("input_ids");
  GenerateOptions o;
  o.max_new_tokens = 16;
  o.ignore_eos = true;
  std::vector<std::string> all = GetParam().adapters;
  all.push_back("");
  for (const std::string& a : all) {
    Session s(*m, a);
    EXPECT_EQ(s.generate(ids, o).tokens, r.ids((a.empty() ? "base" : a) + ".greedy_ids"))
        << "adapter '" << a << "'";
  }
  // Every adapter and the base model in one batch: each decode step mixes them all.
  const std::vector<std::vector<int32_t>> prompts(all.size(), ids);
  const std::vector<GenerateResult> got = generate_batch(*m, prompts, o, all);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(got[i].tokens, r.ids((all[i].empty() ? "base" : all[i]) + ".greedy_ids"))
        << "adapter '" << all[i] << "' batched";
  }
}

// PEFT's mixed batch (model(input_ids, adapter_names=[...])): one step over every row.
TEST_P(LoraParity, MixedBatchMatchesPeft) {
  for (int threads : {1, 2}) {
    auto m = load(DType::kF32, threads);
    const Reference r = ref();
    const std::vector<int32_t> flat = r.ids("mixed.input_ids");
    const std::vector<std::string> names = mixed_names();
    const size_t rows = names.size(), len = flat.size() / rows;
    std::vector<Sequence> seqs(rows);
    std::vector<StepItem> items;
    for (size_t i = 0; i < rows; ++i) {
      m->set_adapter(seqs[i], names[i]);
      items.push_back({.seq = &seqs[i],
                       .ids = std::span(flat).subspan(i * len, len),
                       .logits = LogitRows::kAll});
    }
    std::vector<float> logits(flat.size() * static_cast<size_t>(m->vocab_size()));
    m->step(items, logits);
    const std::vector<float> want = r.floats("mixed.logits");
    ASSERT_EQ(want.size(), logits.size());
    EXPECT_LT(testing::max_abs_diff(logits.data(), want.data(), want.size()), kTol)
        << threads << " threads";
    for (Sequence& s : seqs) m->release(s);
  }
}

// bf16 slots: the adapters' values rounded to bf16 (|rel| <= 2^-9), still computed in f32.
TEST_P(LoraParity, Bf16SlotsStayCloseToPeft) {
  auto m = load(DType::kBF16);
  const Reference r = ref();
  const std::vector<int32_t> ids = r.ids("input_ids");
  const auto n = static_cast<int64_t>(ids.size());
  for (const std::string& a : GetParam().adapters) {
    Sequence seq;
    m->set_adapter(seq, a);
    std::vector<float> logits(static_cast<size_t>(n * m->vocab_size()));
    m->prefill(seq, ids, logits, /*all_logits=*/true);
    m->release(seq);
    const std::vector<float> want = r.floats(a + ".logits");
    EXPECT_LT(testing::max_abs_diff(logits.data(), want.data(), want.size()), 0.1f)
        << "adapter '" << a << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Peft, LoraParity,
                         ::testing::Values(Case{"qwen3_dense", "qwen3_f32", {"a", "b", "c"}},
                                           Case{"qwen3_layers", "qwen3_f32", {"d", "e"}},
                                           Case{"qwen2_overlays", "qwen2_f32", {"tok", "save"}},
                                           Case{"qwen3_tied_tokens", "qwen3_f32", {"tied"}},
                                           Case{"qwen3_moe_experts", "qwen3_moe_f32", {"e1", "e2"}},
                                           Case{"qwen3_moe_router", "qwen3_moe_f32", {"g"}},
                                           Case{"demo", "models/demo", {"scribe"}}),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace metrale
