// The MTP drafter (engine/mtp_proposer.h) against vLLM's forward of the same MTP layer
// (tests/data/fixtures/<dir>/mtp_reference.safetensors, tools/fixtures/models/mtp_fixtures.py):
// its rows after prefill and catch-up, the chained drafts, the exact-mode trim and the
// rollback, for a DeepSeek-V3 (MLA, its own shared_head.head), a GLM-4.5 (GQA, the tied head
// shared) and a Qwen3-Next (mtp.*: gated attention, the target's head, drafts chained on the
// normed output; a hybrid target) checkpoint. Tolerance (README): 1e-4 absolute on logits and
// rows, drafts equal; measured 1.6e-5 / 1.0e-5 / 2.4e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "mtp_fixture.h"

namespace metrale {
namespace {

using speculative::CatchupRows;
using speculative::ProposeArgs;
using speculative::ProposerState;
using testing::MtpPair;
using testing::MtpReference;
using testing::rows_at;

constexpr float kTol = 1e-4f;
constexpr int64_t kDrafts = 4;

float max_diff(const std::vector<float>& a, const std::vector<float>& ref, int64_t row,
               int64_t cols) {
  EXPECT_EQ(a.size(), static_cast<size_t>(cols));
  float m = 0;
  for (int64_t c = 0; c < cols && c < static_cast<int64_t>(a.size()); ++c)
    m = std::max(m, std::abs(a[static_cast<size_t>(c)] - ref[static_cast<size_t>(row * cols + c)]));
  return m;
}

class MtpDrafter : public ::testing::TestWithParam<const char*> {
 protected:
  MtpDrafter()
      : pair_(GetParam()),
        ref_(GetParam()),
        ids_(ref_.ids("ids")),
        hidden_(ref_.floats("target_hidden")),
        logits_(ref_.floats("logits")),
        out_(ref_.floats("hidden_out")),
        H_(pair_.target->config().hidden_size),
        V_(pair_.target->vocab_size()),
        P_(ref_.ids("chain_a.position")[0]) {}

  // The drafter's rows of keys [first, last] against the reference's exact rows.
  void expect_exact_rows(int64_t first, int64_t last) {
    for (int64_t k = first; k <= last; ++k) {
      ASSERT_TRUE(pair_.logits.count(k)) << "key " << k << " never computed";
      EXPECT_LE(max_diff(pair_.logits[k], logits_, k, V_), kTol) << "logits of key " << k;
      EXPECT_LE(max_diff(pair_.out[k], out_, k, H_), kTol) << "row of key " << k;
    }
  }
  // The chain from `tag`'s position against the reference: drafts, logits and rows.
  void expect_chain(const std::string& tag, const std::vector<int32_t>& drafts) {
    const int64_t position = ref_.ids(tag + ".position")[0];
    EXPECT_EQ(drafts, ref_.ids(tag + ".ids")) << tag;
    const std::vector<float> l = ref_.floats(tag + ".logits"), y = ref_.floats(tag + ".hidden_out");
    for (int64_t j = 0; j < kDrafts; ++j) {
      const int64_t key = position - 1 + j;
      EXPECT_LE(max_diff(pair_.logits[key], l, j, V_), kTol) << tag << " draft " << j;
      EXPECT_LE(max_diff(pair_.out[key], y, j, H_), kTol) << tag << " draft " << j;
    }
  }
  void prefill(ProposerState& s, int64_t n) {
    pair_.drafter->prefill_drafter(s, std::span(ids_).first(static_cast<size_t>(n)),
                                   rows_at(hidden_, 0, n, H_));
  }
  std::vector<int32_t> propose(ProposerState& s, int64_t position, int64_t n) {
    std::vector<int32_t> drafts;
    pair_.drafter->propose({.state = &s,
                            .last = ids_[static_cast<size_t>(position)],
                            .hidden = rows_at(hidden_, position - 1, 1, H_),
                            .position = position,
                            .n = n},
                           drafts);
    return drafts;
  }
  // As if the target accepted `accepted` drafts equal to the reference's continuation after
  // `position`: the trim, then the accepted span's rows from the target's hiddens.
  void accept(ProposerState& s, int64_t position, int64_t accepted) {
    pair_.drafter->after_verify(s, accepted);
    if (accepted == 0) return;
    pair_.drafter->catchup(
        s, CatchupRows{.first_key = position,
                       .ids = std::span(ids_).subspan(static_cast<size_t>(position + 1),
                                                      static_cast<size_t>(accepted)),
                       .hidden = rows_at(hidden_, position, accepted, H_)});
  }

  MtpPair pair_;
  MtpReference ref_;
  std::vector<int32_t> ids_;
  std::vector<float> hidden_, logits_, out_;
  int64_t H_, V_, P_;
};

TEST_P(MtpDrafter, PrefillAndChainedDraftsMatchTheReference) {
  auto s = pair_.drafter->alloc_state();
  prefill(*s, P_);
  EXPECT_EQ(MtpProposer::keys(*s), P_ - 1);
  expect_exact_rows(0, P_ - 2);
  expect_chain("chain_a", propose(*s, P_, kDrafts));
  EXPECT_EQ(MtpProposer::keys(*s), P_ - 1 + kDrafts);
  pair_.drafter->free_state(*s);
}

// Verify cycles in exact mode: after each, only the row from the target's hidden stays, the
// accepted span comes back through catchup(), and every row the drafter then holds is the
// reference's exact row — so the chain from position P + 6 is the reference's chain_b.
TEST_P(MtpDrafter, CatchupKeepsEveryRowExact) {
  auto s = pair_.drafter->alloc_state();
  prefill(*s, P_);
  EXPECT_EQ(propose(*s, P_, kDrafts).size(), static_cast<size_t>(kDrafts));
  accept(*s, P_, 2);  // keys P .. P+1 refed; the bonus is ids[P + 3]
  EXPECT_EQ(MtpProposer::keys(*s), P_ + 2);
  const std::vector<int32_t> one = propose(*s, P_ + 3, 1);
  ASSERT_EQ(one.size(), 1u);
  const auto row = static_cast<size_t>((P_ + 2) * V_);
  EXPECT_EQ(one[0], std::max_element(logits_.begin() + static_cast<long>(row),
                                     logits_.begin() + static_cast<long>(row + V_)) -
                        (logits_.begin() + static_cast<long>(row)));
  accept(*s, P_ + 3, 1);
  // No drafts this step: the row is recorded and computed with the next propose.
  EXPECT_TRUE(propose(*s, P_ + 5, 0).empty());
  pair_.drafter->after_verify(*s, 0);
  const int64_t b = ref_.ids("chain_b.position")[0];
  ASSERT_EQ(b, P_ + 6);
  expect_chain("chain_b", propose(*s, b, kDrafts));
  expect_exact_rows(0, b - 1);
}

TEST_P(MtpDrafter, ProposingBelowTheContextRollsBack) {
  auto s = pair_.drafter->alloc_state();
  prefill(*s, P_);
  propose(*s, P_, kDrafts);
  pair_.drafter->after_verify(*s, 0);
  pair_.logits.clear();
  const std::vector<int32_t> d = propose(*s, 12, 1);  // keys 11.. dropped, key 11 recomputed
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(MtpProposer::keys(*s), 12);
  expect_exact_rows(11, 11);
  EXPECT_EQ(pair_.logits.size(), 1u);
}

// A batch of sequences drafts what each drafts alone, bit for bit (and the pass split by a
// small max_rows changes nothing either).
TEST_P(MtpDrafter, BatchAndChunksDraftWhatOneSequenceDrafts) {
  MtpPair small(GetParam(), {.max_rows = 3});
  std::map<std::pair<const ProposerState*, int64_t>, std::vector<float>> batch;
  small.drafter->set_trace([&](const ProposerState& st, int64_t key, const float* l, const float*) {
    batch[{&st, key}].assign(l, l + V_);
  });
  auto a = small.drafter->alloc_state();
  auto b = small.drafter->alloc_state();
  const int64_t pb = P_ + 6;
  small.drafter->prefill_drafter(*a, std::span(ids_).first(static_cast<size_t>(P_)),
                                 rows_at(hidden_, 0, P_, H_));
  small.drafter->prefill_drafter(*b, std::span(ids_).first(static_cast<size_t>(pb)),
                                 rows_at(hidden_, 0, pb, H_));
  const ProposeArgs args[] = {{.state = a.get(),
                               .last = ids_[static_cast<size_t>(P_)],
                               .hidden = rows_at(hidden_, P_ - 1, 1, H_),
                               .position = P_,
                               .n = kDrafts},
                              {.state = b.get(),
                               .last = ids_[static_cast<size_t>(pb)],
                               .hidden = rows_at(hidden_, pb - 1, 1, H_),
                               .position = pb,
                               .n = 2}};
  std::vector<int32_t> drafts[2];
  small.drafter->propose_batch(args, drafts);
  EXPECT_EQ(drafts[0], ref_.ids("chain_a.ids"));
  const std::vector<int32_t> chain_b = ref_.ids("chain_b.ids");
  EXPECT_EQ(drafts[1], std::vector<int32_t>(chain_b.begin(), chain_b.begin() + 2));

  auto alone = pair_.drafter->alloc_state();
  prefill(*alone, P_);
  propose(*alone, P_, kDrafts);
  for (int64_t k = 0; k < P_ - 1 + kDrafts; ++k) {
    const auto at = batch.find({a.get(), k});
    ASSERT_NE(at, batch.end()) << k;
    EXPECT_EQ(at->second, pair_.logits[k]) << "key " << k;
  }
}

// End to end: the drafter reads the hiddens metrale's own target computes (after its final
// norm, the HiddenSink's last index) and drafts the reference's chain.
TEST_P(MtpDrafter, DraftsFromTheTargetsOwnHiddens) {
  Model& m = *pair_.target;
  const int64_t L = m.config().n_layers, n = P_;
  std::vector<float> hidden(static_cast<size_t>(n * H_));
  const HiddenSink sink = [&](int64_t index, ConstRows h) {
    if (index != L) return;
    ASSERT_EQ(h.n_rows, n);
    for (int64_t r = 0; r < n; ++r) std::copy(h.row(r), h.row(r) + H_, hidden.begin() + r * H_);
  };
  Sequence seq;
  std::vector<float> logits(static_cast<size_t>(n * V_));
  m.prefill(seq, std::span(ids_).first(static_cast<size_t>(n)), logits, true, &sink);
  m.release(seq);
  float worst = 0;
  for (size_t i = 0; i < hidden.size(); ++i)
    worst = std::max(worst, std::abs(hidden[i] - hidden_[i]));
  EXPECT_LE(worst, kTol) << "the target's post-norm hiddens";
  auto s = pair_.drafter->alloc_state();
  pair_.drafter->prefill_drafter(*s, std::span(ids_).first(static_cast<size_t>(n)),
                                 rows_at(hidden, 0, n, H_));
  std::vector<int32_t> drafts;
  pair_.drafter->propose({.state = s.get(),
                          .last = ids_[static_cast<size_t>(n)],
                          .hidden = rows_at(hidden, n - 1, 1, H_),
                          .position = n,
                          .n = kDrafts},
                         drafts);
  EXPECT_EQ(drafts, ref_.ids("chain_a.ids"));
}

// Weights read in place from the checkpoint's mmap (one tensor per part instead of fused
// matrices) draft the same.
TEST_P(MtpDrafter, WeightsInPlaceDraftTheSame) {
  MtpPair in_place(GetParam(), {.placement = WeightPlacement::kInPlace});
  auto s = in_place.drafter->alloc_state();
  in_place.drafter->prefill_drafter(*s, std::span(ids_).first(static_cast<size_t>(P_)),
                                    rows_at(hidden_, 0, P_, H_));
  std::vector<int32_t> drafts;
  in_place.drafter->propose({.state = s.get(),
                             .last = ids_[static_cast<size_t>(P_)],
                             .hidden = rows_at(hidden_, P_ - 1, 1, H_),
                             .position = P_,
                             .n = kDrafts},
                            drafts);
  EXPECT_EQ(drafts, ref_.ids("chain_a.ids"));
  for (int64_t k = 0; k + 1 < P_; ++k)
    EXPECT_LE(max_diff(in_place.logits[k], logits_, k, V_), kTol) << "key " << k;
}

// demo_mtp: the trained pair models/demo_mtp ships (a dense MLA layer, the tied head shared),
// its reference from tools/demo/train_demo_mtp.py by the same forward.
INSTANTIATE_TEST_SUITE_P(Fixtures, MtpDrafter,
                         ::testing::Values("deepseek_v3_mtp_bf16", "glm4_moe_qknorm_bf16",
                                           "qwen3_next_bf16", "demo_mtp"));

TEST(MtpDrafterLoad, HeadsAndPoolAsTheCheckpointShipsThem) {
  MtpPair ds("deepseek_v3_mtp_bf16");
  EXPECT_TRUE(ds.drafter->layer().own_head());  // a shared_head.head unlike the tied head
  EXPECT_EQ(ds.drafter->layer().prefix(), "model.layers.3.");
  // One MLA layer's latent + rope key, not the target's three layers.
  EXPECT_EQ(ds.drafter->kv_pool().bytes_per_token(), (24 + 8) * 4);
  MtpPair glm("glm4_moe_qknorm_bf16");
  EXPECT_FALSE(glm.drafter->layer().own_head());  // its shared_head.head equals the tied head
  EXPECT_EQ(glm.drafter->kv_pool().bytes_per_token(), 2 * 2 * 32 * 4);
  MtpPair qwen("qwen3_next_bf16");  // the target's head; one gated-attention layer, 2 kv x 32
  EXPECT_FALSE(qwen.drafter->layer().own_head());
  EXPECT_EQ(qwen.drafter->layer().prefix(), "mtp.");
  EXPECT_FALSE(qwen.drafter->layer().zero_first_key());
  EXPECT_TRUE(qwen.drafter->layer().chain_normed());
  EXPECT_EQ(qwen.drafter->kv_pool().bytes_per_token(), 2 * 2 * 32 * 4);
  EXPECT_EQ(glm.drafter->name(), "mtp");
  EXPECT_TRUE(glm.drafter->needs_hidden());
  EXPECT_EQ(glm.drafter->hidden_size(), 64);
}

}  // namespace
}  // namespace metrale
