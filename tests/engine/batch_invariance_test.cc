// A row's result must not depend on its company: decode alone == decode co-batched, chunked
// prefill == one-piece prefill, 1 thread == 2 threads — bit for bit (DESIGN.md numerics).
// A parameter "<fixture>@bf16" runs the same checks under LoadOptions::compute = kBF16.
#include <gtest/gtest.h>

#include "engine/model.h"
#include "fixture_util.h"

namespace metrale {
namespace {

using testing::Reference;

std::string fixture_of(const std::string& param) { return param.substr(0, param.find('@')); }

std::unique_ptr<Model> load(const std::string& param, int threads, int64_t max_rows) {
  LoadOptions o;
  o.n_threads = threads;
  o.kv_tokens = 512;
  o.max_rows = max_rows;
  o.compute = param.ends_with("@bf16") ? Compute::kBF16 : Compute::kF32;
  return Model::load(testing::fixture_dir(fixture_of(param)), o);
}

// Logits of every prompt position, prefilled with chunks of at most max_rows.
std::vector<float> prefill_logits(Model& m, const std::vector<int32_t>& ids) {
  std::vector<float> logits(ids.size() * static_cast<size_t>(m.vocab_size()));
  Sequence seq;
  m.prefill(seq, ids, logits, /*all_logits=*/true);
  m.release(seq);
  return logits;
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, ChunkedPrefillEqualsOnePiece) {
  const std::vector<int32_t> ids = Reference(fixture_of(GetParam())).ids("input_ids");
  auto whole = load(GetParam(), 2, 64);
  const std::vector<float> want = prefill_logits(*whole, ids);
  for (int64_t chunk : {1, 3, 7, 16}) {
    auto chunked = load(GetParam(), 2, chunk);
    EXPECT_EQ(prefill_logits(*chunked, ids), want) << "chunks of " << chunk;
  }
}

TEST_P(BatchInvariance, ThreadCountDoesNotChangeResults) {
  const std::vector<int32_t> ids = Reference(fixture_of(GetParam())).ids("input_ids");
  auto one = load(GetParam(), 1, 64);
  auto two = load(GetParam(), 2, 64);
  EXPECT_EQ(prefill_logits(*one, ids), prefill_logits(*two, ids));
}

TEST_P(BatchInvariance, DecodeAloneEqualsCoBatched) {
  const Reference ref(fixture_of(GetParam()));
  const std::vector<int32_t> a = ref.ids("input_ids"), b = ref.ids("input_ids_b");
  auto m = load(GetParam(), 2, 64);
  const auto V = static_cast<size_t>(m->vocab_size());
  std::vector<float> scratch(V);
  const std::vector<int32_t> steps = ref.ids("greedy_ids");

  // Alone: A decodes its greedy continuation by itself.
  std::vector<std::vector<float>> alone;
  {
    Sequence s;
    m->prefill(s, a, scratch);
    for (int32_t t : steps) {
      Sequence* p = &s;
      m->decode({&p, 1}, {&t, 1}, scratch);
      alone.push_back(scratch);
    }
    m->release(s);
  }
  // Co-batched: A in the middle of B and another B at a different length.
  Sequence sa, sb, sc;
  m->prefill(sb, b, scratch);
  m->prefill(sa, a, scratch);
  m->prefill(sc, std::vector<int32_t>(b.begin(), b.begin() + 5), scratch);
  std::vector<float> logits(3 * V);
  for (size_t i = 0; i < steps.size(); ++i) {
    Sequence* batch[] = {&sb, &sa, &sc};
    const int32_t tokens[] = {7, steps[i], 11};
    m->decode(batch, tokens, logits);
    const std::vector<float> row(logits.begin() + static_cast<long>(V), logits.begin() + static_cast<long>(2 * V));
    EXPECT_EQ(row, alone[i]) << "step " << i;
  }
  for (Sequence* s : {&sa, &sb, &sc}) m->release(*s);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchInvariance, ::testing::Values("qwen3_f32", "llama_bf16", "qwen2_f32", "qwen3_bf16@bf16",
                                                                  "llama_bf16@bf16"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           for (char& ch : name) ch = ch == '@' ? '_' : ch;
                           return name;
                         });

}  // namespace
}  // namespace metrale
