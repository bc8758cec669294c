// The step's pooled output (StepItem::pool, what embeddings read): the rows it sums are the
// final-norm hidden states a HiddenSink sees, bit for bit, whichever rows share the step, and a
// sum carried over a long input's chunks equals one step's.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "engine/model.h"
#include "fixture_util.h"

namespace metrale {
namespace {

std::unique_ptr<Model> load(const std::string& fixture) {
  return Model::load(testing::fixture_dir(fixture),
                     {.n_threads = 2, .kv_tokens = 256, .max_rows = 32});
}

const std::vector<int32_t> kIds = {5, 17, 200, 33, 9, 120, 7, 61};
const std::vector<int32_t> kOther = {44, 3, 91, 12, 250};

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

// The hidden states after the final norm (HiddenSink's last index) of one prefill of ids.
std::vector<float> final_hidden(Model& m, const std::vector<int32_t>& ids) {
  const int64_t H = m.config().hidden_size,
                L = static_cast<int64_t>(m.architecture().layers.size());
  std::vector<float> out(ids.size() * static_cast<size_t>(H));
  const HiddenSink sink = [&](int64_t index, ConstRows h) {
    if (index != L) return;
    for (int64_t r = 0; r < h.n_rows; ++r)
      std::memcpy(out.data() + r * H, h.row(r), static_cast<size_t>(H) * sizeof(float));
  };
  std::vector<float> logits(ids.size() * static_cast<size_t>(m.vocab_size()));
  Sequence seq;
  m.prefill(seq, ids, logits, /*all_logits=*/true, &sink);
  m.release(seq);
  return out;
}

// The pooled row of one step over ids.
std::vector<float> pooled_of(Model& m, const std::vector<int32_t>& ids, PoolRows pool) {
  std::vector<float> out(static_cast<size_t>(m.config().hidden_size), 0.0f);
  Sequence seq;
  const StepItem it{.seq = &seq, .ids = ids, .logits = LogitRows::kNone, .pool = pool};
  m.step({&it, 1}, {}, nullptr, out);
  m.release(seq);
  return out;
}

class PooledStep : public ::testing::TestWithParam<const char*> {};

TEST_P(PooledStep, PoolsTheFinalNormHiddenStates) {
  auto m = load(GetParam());
  const auto H = static_cast<size_t>(m->config().hidden_size);
  const std::vector<float> hidden = final_hidden(*m, kIds);
  std::vector<float> sum(H, 0.0f);  // the op's order: from zero, rows ascending
  for (size_t r = 0; r < kIds.size(); ++r)
    for (size_t c = 0; c < H; ++c) sum[c] += hidden[r * H + c];
  EXPECT_EQ(pooled_of(*m, kIds, PoolRows::kAll), sum);
  EXPECT_EQ(pooled_of(*m, kIds, PoolRows::kFirst),
            std::vector<float>(hidden.begin(), hidden.begin() + static_cast<ptrdiff_t>(H)));
  EXPECT_EQ(pooled_of(*m, kIds, PoolRows::kLast),
            std::vector<float>(hidden.end() - static_cast<ptrdiff_t>(H), hidden.end()));
}

TEST_P(PooledStep, PoolingBesideDecodeAndOtherInputsChangesNothing) {
  auto m = load(GetParam());
  const auto H = static_cast<size_t>(m->config().hidden_size);
  const auto V = static_cast<size_t>(m->vocab_size());
  const std::vector<float> last_alone = pooled_of(*m, kIds, PoolRows::kLast);
  const std::vector<float> mean_alone = pooled_of(*m, kOther, PoolRows::kAll);
  // A decoding sequence's logits alone.
  auto decode_logits = [&](bool with_pooling, std::vector<float>* pooled) {
    Sequence gen;
    std::vector<float> logits(V);
    const std::vector<int32_t> prompt = {8, 19, 301};
    m->prefill(gen, prompt, logits);
    const std::vector<int32_t> next = {77};
    Sequence a, b;
    std::vector<StepItem> items = {{.seq = &gen, .ids = next, .logits = LogitRows::kLast}};
    if (with_pooling) {
      // Two pooling items around the decode row: their pooled rows are not one range.
      items.insert(items.begin(),
                   {.seq = &a, .ids = kIds, .logits = LogitRows::kNone, .pool = PoolRows::kLast});
      items.push_back(
          {.seq = &b, .ids = kOther, .logits = LogitRows::kNone, .pool = PoolRows::kAll});
      pooled->assign(2 * H, 0.0f);
    }
    m->step(items, logits, nullptr, with_pooling ? std::span<float>(*pooled) : std::span<float>());
    m->release(a);
    m->release(b);
    m->release(gen);
    return logits;
  };
  std::vector<float> pooled;
  const std::vector<float> alone = decode_logits(false, nullptr);
  EXPECT_EQ(decode_logits(true, &pooled), alone);
  EXPECT_EQ(std::vector<float>(pooled.begin(), pooled.begin() + static_cast<ptrdiff_t>(H)),
            last_alone);
  EXPECT_EQ(std::vector<float>(pooled.begin() + static_cast<ptrdiff_t>(H), pooled.end()),
            mean_alone);
}

TEST_P(PooledStep, ASumCarriedOverChunksEqualsOneStep) {
  auto m = load(GetParam());
  const std::vector<float> whole = pooled_of(*m, kIds, PoolRows::kAll);
  std::vector<float> sum(whole.size(), 0.0f);
  Sequence seq;
  const std::span<const int32_t> ids(kIds);
  for (const auto& [at, len] : {std::pair<size_t, size_t>{0, 3}, {3, 5}}) {
    const StepItem it{.seq = &seq,
                      .ids = ids.subspan(at, len),
                      .logits = LogitRows::kNone,
                      .pool = PoolRows::kAll};
    m->step({&it, 1}, {}, nullptr, sum);
  }
  m->release(seq);
  EXPECT_EQ(sum, whole);
}

INSTANTIATE_TEST_SUITE_P(Families, PooledStep,
                         ::testing::Values("qwen3_f32", "qwen3_next_f32", "deepseek_v3_bias_bf16"));

TEST(PooledStep, BadPoolingIsRefused) {
  auto m = load("qwen3_f32");
  Sequence seq;
  std::vector<float> logits(static_cast<size_t>(m->vocab_size()));
  std::vector<float> pooled(static_cast<size_t>(m->config().hidden_size));
  const StepItem both{.seq = &seq, .ids = kIds, .logits = LogitRows::kLast, .pool = PoolRows::kAll};
  EXPECT_EQ(error_of([&] {
              m->step({&both, 1}, logits, nullptr, pooled);
            }),
            "step: item 0 pools its rows and wants logits too; an item does one or the other");
  const StepItem pool{.seq = &seq, .ids = kIds, .logits = LogitRows::kNone, .pool = PoolRows::kAll};
  EXPECT_EQ(error_of([&] {
              m->step({&pool, 1}, {}, nullptr, logits);
            }),
            "step: pooled buffer holds " + std::to_string(logits.size()) + " floats, expected " +
                std::to_string(pooled.size()) + " (1 pooling items)");
  EXPECT_TRUE(seq.tokens.empty());
}

}  // namespace
}  // namespace metrale
