// Tokenizer encode throughput (MB/s of UTF-8 input) on the test corpus repeated to ~1 MB, for
// the Qwen3 and DeepSeek-V3 tokenizers. Run from the source root (or set METRALE_SOURCE_DIR).
// The peer figure comes from tools/bench/tokenizer_peer.py on the same text.
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "../tests/io/tokenizer/gzip_file.h"
#include "io/tokenizer/tokenizer.h"

namespace {

std::string root() {
  const char* env = std::getenv("METRALE_SOURCE_DIR");
  return env ? std::string(env) + "/" : std::string();
}

// The corpus cases that are valid UTF-8, one per line, repeated to at least 1 MB.
const std::vector<std::string>& corpus_lines() {
  static const std::vector<std::string> lines = [] {
    const auto golden = nlohmann::json::parse(
        metrale::testing::read_gzip_file(root() + "tests/data/tokenizers/golden.json.gz"));
    std::vector<std::string> base, out;
    for (const auto& c : golden["cases"]) {
      const std::string name = c["name"];
      if (name.rfind("invalid", 0) == 0) continue;
      const std::string hex = c["hex"];
      std::string s;
      for (size_t i = 0; i + 1 < hex.size(); i += 2)
        s.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
      base.push_back(s);
    }
    size_t total = 0;
    while (total < (1u << 20)) {
      for (const auto& s : base) {
        out.push_back(s);
        total += s.size() + 1;
      }
    }
    return out;
  }();
  return lines;
}

const metrale::Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, metrale::Tokenizer> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const std::string text = metrale::testing::read_gzip_file(root() + "tests/data/tokenizers/" +
                                                            name + "/tokenizer.json.gz");
  return cache.emplace(name, metrale::Tokenizer::from_json(text, name)).first->second;
}

// One encode call per corpus line (the shape of chat prompts).
void BM_EncodeLines(benchmark::State& state, const std::string& name) {
  const auto& tok = tokenizer(name);
  const auto& lines = corpus_lines();
  size_t bytes = 0, ids = 0;
  for (auto _ : state) {
    for (const auto& l : lines) {
      auto v = tok.encode(l, false);
      ids += v.size();
      bytes += l.size();
      benchmark::DoNotOptimize(v.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["ids_per_iter"] =
      static_cast<double>(ids) / static_cast<double>(state.iterations());
}

// The whole ~1 MB joined by newlines in one call (the shape of a long document).
void BM_EncodeDocument(benchmark::State& state, const std::string& name) {
  const auto& tok = tokenizer(name);
  std::string doc;
  for (const auto& l : corpus_lines()) doc += l + "\n";
  for (auto _ : state) {
    auto v = tok.encode(doc, false);
    benchmark::DoNotOptimize(v.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(doc.size() * state.iterations()));
}

BENCHMARK_CAPTURE(BM_EncodeLines, qwen3, std::string("qwen3"))
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeLines, deepseek_v3, std::string("deepseek_v3"))
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeDocument, qwen3, std::string("qwen3"))
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeDocument, deepseek_v3, std::string("deepseek_v3"))
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
