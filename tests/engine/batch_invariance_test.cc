// A row's result must not depend on its company: decode alone == decode co-batched, chunked
// prefill == one-piece prefill, 1 thread == 2 threads, a k-row verify == k single decodes, one
// ragged step == its parts run alone, and truncate + continue == never having gone further —
// bit for bit (docs/architecture.md, numerics).
// A parameter "<fixture>@bf16" / "<fixture>@int8" runs the same checks under
// LoadOptions::compute = kBF16 / kInt8.
#include <gtest/gtest.h>

#include "core/error.h"
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
  o.compute = param.ends_with("@bf16")   ? Compute::kBF16
              : param.ends_with("@int8") ? Compute::kInt8
                                         : Compute::kF32;
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

// Hybrid models too, bit for bit: the CPU backend runs the delta rule token by token for every
// run (its chunked form, equal within rounding, is off: cpu/gated_delta.h), so where a chunk
// ends does not change the arithmetic.
TEST_P(BatchInvariance, ChunkedPrefillEqualsOnePiece) {
  const std::vector<int32_t> ids = Reference(fixture_of(GetParam())).ids("input_ids");
  auto whole = load(GetParam(), 2, 128);
  const std::vector<float> want = prefill_logits(*whole, ids);
  for (int64_t chunk : {1, 3, 7, 16, 64}) {
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
    const std::vector<float> row(logits.begin() + static_cast<long>(V),
                                 logits.begin() + static_cast<long>(2 * V));
    EXPECT_EQ(row, alone[i]) << "step " << i;
  }
  for (Sequence* s : {&sa, &sb, &sc}) m->release(*s);
}

// Logits of decoding `tokens` one step at a time after prefilling `prompt`.
std::vector<float> decode_one_by_one(Model& m, const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& tokens) {
  const auto V = static_cast<size_t>(m.vocab_size());
  std::vector<float> scratch(V), out;
  Sequence s;
  m.prefill(s, prompt, scratch);
  for (int32_t t : tokens) {
    Sequence* p = &s;
    m.decode({&p, 1}, {&t, 1}, scratch);
    out.insert(out.end(), scratch.begin(), scratch.end());
  }
  m.release(s);
  return out;
}

TEST_P(BatchInvariance, VerifyRowsEqualSingleDecodes) {
  const Reference ref(fixture_of(GetParam()));
  const std::vector<int32_t> a = ref.ids("input_ids");
  const std::vector<int32_t> greedy = ref.ids("greedy_ids");
  const std::vector<int32_t> draft(greedy.begin(), greedy.begin() + 5);
  auto m = load(GetParam(), 2, 64);
  const auto V = static_cast<size_t>(m->vocab_size());
  const std::vector<float> want = decode_one_by_one(*m, a, draft);
  // The 5 draft tokens in one step: one row each, all logits.
  Sequence s;
  std::vector<float> scratch(V), got(draft.size() * V);
  m->prefill(s, a, scratch);
  const StepItem verify{.seq = &s, .ids = draft, .logits = LogitRows::kAll};
  m->step({&verify, 1}, got);
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.tokens.size(), a.size() + draft.size());
  m->release(s);
}

TEST_P(BatchInvariance, RaggedStepEqualsItsPartsAlone) {
  const Reference ref(fixture_of(GetParam()));
  const std::vector<int32_t> a = ref.ids("input_ids"), b = ref.ids("input_ids_b"),
                             g = ref.ids("greedy_ids");
  auto m = load(GetParam(), 2, 64);
  const auto V = static_cast<size_t>(m->vocab_size());
  std::vector<float> scratch(V);
  // Alone: B's prefill in one piece (last logits); A decodes one token; A' verifies 3.
  std::vector<float> b_alone(V);
  {
    Sequence s;
    m->prefill(s, b, b_alone);
    m->release(s);
  }
  const std::vector<float> a_alone = decode_one_by_one(*m, a, {g[0]});
  const std::vector<float> v_alone =
      decode_one_by_one(*m, std::vector<int32_t>(a.begin(), a.begin() + 9), {g[3], g[4], g[5]});
  // Together in one step: verify rows, a prefill chunk and a decode row, interleaved.
  Sequence sa, sv, sb;
  m->prefill(sa, a, scratch);
  m->prefill(sv, std::vector<int32_t>(a.begin(), a.begin() + 9), scratch);
  const std::vector<int32_t> v_ids = {g[3], g[4], g[5]};
  const StepItem items[] = {{.seq = &sv, .ids = v_ids, .logits = LogitRows::kAll},
                            {.seq = &sb, .ids = b, .logits = LogitRows::kLast},
                            {.seq = &sa, .ids = std::span(g).first(1), .logits = LogitRows::kLast}};
  std::vector<float> got(5 * V);
  m->step(items, got);
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + static_cast<long>(3 * V)), v_alone);
  EXPECT_EQ(std::vector<float>(got.begin() + static_cast<long>(3 * V),
                               got.begin() + static_cast<long>(4 * V)),
            b_alone);
  EXPECT_EQ(std::vector<float>(got.begin() + static_cast<long>(4 * V), got.end()), a_alone);
  for (Sequence* s : {&sa, &sv, &sb}) m->release(*s);
}

TEST_P(BatchInvariance, TruncateThenContinueEqualsFresh) {
  const Reference ref(fixture_of(GetParam()));
  const std::vector<int32_t> a = ref.ids("input_ids"), g = ref.ids("greedy_ids");
  auto m = load(GetParam(), 2, 64);
  const auto V = static_cast<size_t>(m->vocab_size());
  const int64_t free_before = m->kv_pool().free_pages();
  // Run 6 rejected draft tokens past the prompt, roll back to prompt + 2, continue with 3 others.
  Sequence s;
  std::vector<float> scratch(V), rejected(6 * V);
  m->prefill(s, a, scratch);
  const std::vector<int32_t> wrong = {g[0], g[1], 5, 6, 7, 8};
  const StepItem draft{.seq = &s, .ids = wrong, .logits = LogitRows::kAll};
  m->step({&draft, 1}, rejected);
  m->truncate(s, static_cast<int64_t>(a.size()) + 2);
  EXPECT_EQ(s.tokens.size(), a.size() + 2);
  EXPECT_EQ(static_cast<int64_t>(s.block_table.size()),
            (static_cast<int64_t>(a.size()) + 2 + m->kv_pool().layout().page_size - 1) /
                m->kv_pool().layout().page_size);
  const std::vector<int32_t> next = {g[2], g[3], g[4]};
  std::vector<float> got;
  for (int32_t t : next) {
    Sequence* p = &s;
    m->decode({&p, 1}, {&t, 1}, scratch);
    got.insert(got.end(), scratch.begin(), scratch.end());
  }
  std::vector<int32_t> prefix = a;
  prefix.push_back(g[0]);
  prefix.push_back(g[1]);
  EXPECT_EQ(got, decode_one_by_one(*m, prefix, next));
  m->truncate(s, 0);
  EXPECT_TRUE(s.block_table.empty());
  EXPECT_EQ(m->kv_pool().free_pages(), free_before);
  EXPECT_THROW(m->truncate(s, 1), Error);
  m->release(s);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, BatchInvariance,
    ::testing::Values("qwen3_f32", "llama_bf16", "qwen2_f32", "qwen3_bf16@bf16", "llama_bf16@bf16",
                      "qwen3_moe_f32", "qwen3_moe_nonorm_f32", "qwen3_moe_bf16@bf16",
                      "qwen3_next_f32", "qwen3_5_text_bf16@bf16", "qwen3_5_moe_f32",
                      "quant_ct_gptq_actorder", "quant_ct_w4a16_asym", "quant_modelopt_nvfp4",
                      "quant_fp8_block", "quant_ct_w8a16", "quant_ct_gptq_actorder@int8",
                      "quant_ct_w4a16_asym@int8", "quant_modelopt_nvfp4@int8",
                      "quant_ct_w8a16@int8",
                      // the latent KV cache: chunks and decode read it
                      "deepseek_v3_mtp_bf16", "deepseek_v3_noqlora_bf16",
                      "deepseek_v3_noqlora_bf16@bf16", "glm4_moe_qknorm_bf16"),
    [](const ::testing::TestParamInfo<std::string>& p) {
      std::string name = p.param;
      for (char& ch : name) ch = ch == '@' ? '_' : ch;
      return name;
    });

}  // namespace
}  // namespace metrale
