// The step's multimodal inputs: (t, h, w) rope positions with the rope delta carried into
// decode, and embeddings injected in place of token rows. Text is a special case of both, bit
// for bit; bad inputs are refused naming the item.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
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

// All-row logits of one step over kIds, as `edit` shapes the item.
template <class Edit>
std::vector<float> logits_of(Model& m, Edit&& edit, int64_t rope_delta = 0) {
  Sequence seq;
  seq.rope_delta = rope_delta;
  std::vector<float> out(kIds.size() * static_cast<size_t>(m.vocab_size()));
  StepItem it{.seq = &seq, .ids = kIds, .logits = LogitRows::kAll};
  edit(it);
  m.step({&it, 1}, out);
  m.release(seq);
  return out;
}

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(MultimodalRope, EqualAxesAreTheTextRopeAndTheDeltaShiftsEveryAxis) {
  auto m = load("qwen3_5_text_f32");
  ASSERT_TRUE(m->multimodal_rope());
  const std::vector<float> text = logits_of(*m, [](StepItem&) {});
  std::vector<int32_t> p3;
  for (size_t j = 0; j < kIds.size(); ++j) p3.insert(p3.end(), 3, static_cast<int32_t>(j));
  EXPECT_EQ(text, logits_of(*m, [&](StepItem& it) { it.positions3 = p3; }));
  // A delta of 4 with no explicit positions == explicit (p + 4) on every axis.
  std::vector<int32_t> shifted = p3;
  for (int32_t& p : shifted) p += 4;
  const std::vector<float> delta = logits_of(
      *m, [](StepItem&) {}, 4);
  EXPECT_EQ(delta, logits_of(*m, [&](StepItem& it) { it.positions3 = shifted; }));
  EXPECT_NE(delta, text);
  // Distinct h / w positions (an image's grid) change the result.
  std::vector<int32_t> grid = p3;
  grid[3 * 2 + 1] = 7;
  grid[3 * 3 + 2] = 5;
  EXPECT_NE(text, logits_of(*m, [&](StepItem& it) { it.positions3 = grid; }));
}

TEST(MultimodalRope, BadPositionsAreRefused) {
  auto m = load("qwen3_5_text_f32");
  const std::vector<int32_t> short3(5, 0);
  EXPECT_EQ(error_of([&] { logits_of(*m, [&](StepItem& it) { it.positions3 = short3; }); }),
            "step: item 0 has 5 (t, h, w) position values for 8 tokens; expected 24");
  std::vector<int32_t> neg(24, 1);
  neg[7] = -1;
  EXPECT_NE(error_of([&] {
              logits_of(*m, [&](StepItem& it) { it.positions3 = neg; });
            }).find("rope_rows: position -1 (row 2, axis 1)"),
            std::string::npos);
  auto dense = load("qwen3_f32");
  EXPECT_FALSE(dense->multimodal_rope());
  const std::vector<int32_t> p3(24, 0);
  EXPECT_EQ(error_of([&] { logits_of(*dense, [&](StepItem& it) { it.positions3 = p3; }); }),
            "step: item 0 gives multimodal (t, h, w) positions, but qwen3's rope is 1-D");
}

// The f32 rows the model's embedding gives `id` (the table widened to f32).
std::vector<float> embedding_row(const Model& m, int32_t id) {
  const WeightTensor& t = m.architecture().embed;
  std::vector<float> row(static_cast<size_t>(t.n_in));
  if (t.format == WeightFormat::kF32) {
    std::memcpy(row.data(), static_cast<const float*>(t.data) + id * t.n_in, row.size() * 4);
  } else {
    const auto* b = static_cast<const uint16_t*>(t.data) + id * t.n_in;
    for (size_t i = 0; i < row.size(); ++i) row[i] = bf16_to_f32(b[i]);
  }
  return row;
}

TEST(InjectedEmbeddings, ATokensOwnRowChangesNothingAndAnotherRowActsAsThatToken) {
  for (const char* fixture : {"qwen3_f32", "qwen3_5_text_f32", "deepseek_v3_mtp_bf16"}) {
    SCOPED_TRACE(fixture);
    LoadOptions o{.n_threads = 2, .kv_tokens = 256, .max_rows = 32};
    // An in-place embedding keeps the checkpoint's rows (a copied bf16 table may be repacked).
    o.placement = WeightPlacement::kInPlace;
    auto m = Model::load(testing::fixture_dir(fixture), o);
    const int64_t H = m->config().hidden_size;
    const std::vector<float> text = logits_of(*m, [](StepItem&) {});
    std::vector<float> rows = embedding_row(*m, kIds[2]);
    const std::vector<float> other = embedding_row(*m, 44);
    rows.insert(rows.end(), other.begin(), other.end());
    const std::vector<int32_t> at = {2, 5};
    const std::vector<float> injected = logits_of(*m, [&](StepItem& it) {
      it.embeds = {rows.data(), 2, H, H};
      it.embed_rows = at;
    });
    std::vector<int32_t> ids = kIds;
    ids[5] = 44;
    Sequence seq;
    std::vector<float> want(ids.size() * static_cast<size_t>(m->vocab_size()));
    StepItem it{.seq = &seq, .ids = ids, .logits = LogitRows::kAll};
    m->step({&it, 1}, want);
    m->release(seq);
    EXPECT_EQ(injected, want);
    EXPECT_NE(injected, text);
  }
}

TEST(InjectedEmbeddings, BadInjectionsAreRefused) {
  auto m = load("qwen3_f32");
  const int64_t H = m->config().hidden_size;
  std::vector<float> rows(static_cast<size_t>(2 * H));
  const std::vector<int32_t> twice = {3, 3}, outside = {1, 8}, one = {1};
  EXPECT_EQ(error_of([&] {
              logits_of(*m, [&](StepItem& it) {
                it.embeds = {rows.data(), 2, H, H};
                it.embed_rows = twice;
              });
            }),
            "step: item 0: injected row 3 (entry 1) must be ascending within its 8 tokens");
  EXPECT_EQ(error_of([&] {
              logits_of(*m, [&](StepItem& it) {
                it.embeds = {rows.data(), 2, H, H};
                it.embed_rows = outside;
              });
            }),
            "step: item 0: injected row 8 (entry 1) must be ascending within its 8 tokens");
  EXPECT_EQ(error_of([&] {
              logits_of(*m, [&](StepItem& it) {
                it.embeds = {rows.data(), 2, H, H};
                it.embed_rows = one;
              });
            }),
            "step: item 0 injects 2 embedding rows at 1 places");
  EXPECT_EQ(error_of([&] {
              logits_of(*m, [&](StepItem& it) {
                it.embeds = {rows.data(), 1, H - 1, H};
                it.embed_rows = one;
              });
            }),
            "step: item 0's injected embeddings are 63 wide; the model takes 64 (hidden size 64, 0 "
            "deepstack features)");
}

}  // namespace
}  // namespace metrale
