// The grammar mask's cost on the pick's path, over the real Qwen3 tokenizer (151,936 ids):
//
//   BM_ApplyMask/{word,bit}: writing -inf over the disallowed logits of one row, a 32-bit
//     word at a time (apply_token_mask) or a bit at a time (the loop it replaced).
//   BM_MaskStep/rows:B/mode:M: B rows of one decode step, as the scheduler runs them: the
//     "forward" (a sleep of 4 ms: the engine thread waits on it while the cores are free, as
//     beside an accelerator's forward) and then each row's pick (a copy of its logits, the
//     mask, the argmax) and accept. Mode 0: unconstrained (no mask); 1: the mask filled at the
//     pick and applied a bit at a time (the serial path before the prefetch); 2: filled
//     ahead by the mask workers from the accept (GrammarMatcher::prefetch), the pick waits
//     for it and applies it a word at a time. `pick_ms` is the time per step the picks took
//     after the forward; mode 1 or 2 less mode 0 is the mask's cost on the critical path.
//
// Run from the source root (or set METRALE_SOURCE_DIR):
//   build/release/bench/grammar_mask_bench --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "../tests/io/tokenizer/gzip_file.h"
#include "grammar/grammar.h"
#include "io/tokenizer/tokenizer.h"

namespace {

using metrale::GrammarMatcher;

std::string root() {
  const char* env = std::getenv("METRALE_SOURCE_DIR");
  return env ? std::string(env) + "/" : std::string();
}

// bench/compare/grammar_overhead.py's regex: any text of letters and punctuation, never
// ending (no '#' is picked from these logits), so every step is a constrained step.
std::shared_ptr<const metrale::CompiledGrammar> grammar() {
  static const metrale::Tokenizer tok = metrale::Tokenizer::from_json(
      metrale::testing::read_gzip_file(root() + "tests/data/tokenizers/qwen3/tokenizer.json.gz"),
      "qwen3 tokenizer.json");
  static metrale::GrammarCompiler compiler(tok, 151936, {*tok.token_to_id("<|im_end|>")});
  static const auto g = compiler.compile(
      {.kind = metrale::GrammarSpec::Kind::kRegex, .text = "([A-Za-z,.;:' ]|\\n)*#"});
  return g;
}

std::vector<float> random_row(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> row(n);
  for (float& x : row) x = std::uniform_real_distribution<float>(-4, 4)(rng);
  return row;
}

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

void bitwise_apply(std::span<const uint32_t> mask, std::span<float> logits) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < mask.size(); ++w) {
    const uint32_t word = mask[w];
    if (word == 0xffffffffu) continue;
    const size_t end = std::min(logits.size(), (w + 1) * 32);
    for (size_t i = w * 32; i < end; ++i)
      if (!((word >> (i - w * 32)) & 1u)) logits[i] = ninf;
  }
}

void BM_ApplyMask(benchmark::State& state) {
  GrammarMatcher m(grammar());
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_mask(mask);
  const std::vector<float> base = random_row(static_cast<size_t>(m.vocab_size()), 1);
  std::vector<float> row = base;
  for (auto _ : state) {
    state.PauseTiming();
    row = base;
    state.ResumeTiming();
    if (state.range(0) == 0) {
      metrale::apply_token_mask(mask, row);
    } else {
      bitwise_apply(mask, row);
    }
    benchmark::DoNotOptimize(row.data());
  }
}
BENCHMARK(BM_ApplyMask)->Arg(0)->Arg(1)->ArgNames({"bitwise"});

void BM_MaskStep(benchmark::State& state) {
  const auto rows = static_cast<size_t>(state.range(0));
  const int64_t mode = state.range(1);
  std::vector<std::optional<GrammarMatcher>> ms(rows);
  for (auto& m : ms) m.emplace(grammar());
  const size_t V = static_cast<size_t>(ms[0]->vocab_size());
  std::vector<std::vector<float>> logits;
  for (size_t i = 0; i < 8; ++i) logits.push_back(random_row(V, 10 + static_cast<uint32_t>(i)));
  std::vector<uint32_t> mask(ms[0]->mask_words());
  std::vector<float> row(V);
  double pick_s = 0;
  uint64_t step = 0;
  for (auto _ : state) {
    std::this_thread::sleep_for(std::chrono::milliseconds(4));  // the forward
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < rows; ++i) {
      GrammarMatcher& m = *ms[i];
      row = logits[(step + i) % logits.size()];
      if (mode == 0) {
        benchmark::DoNotOptimize(argmax(row));
        continue;
      }
      if (mode == 2) {
        m.apply_mask(row);
      } else if (m.fill_mask(mask)) {
        bitwise_apply(mask, row);
      }
      m.accept(argmax(row));
      if (mode == 2) m.prefetch();
    }
    pick_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++step;
  }
  state.counters["pick_ms"] = pick_s * 1e3 / static_cast<double>(step);
  state.counters["mask_threads"] = metrale::grammar_mask_threads();
}
BENCHMARK(BM_MaskStep)
    ->ArgsProduct({{1, 4, 16}, {0, 1, 2}})
    ->ArgNames({"rows", "mode"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
