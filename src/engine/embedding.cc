#include "engine/embedding.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace metrale {

PoolRows pooled_rows(Pooling pooling, int64_t start, int64_t len, int64_t total) {
  switch (pooling) {
    case Pooling::kMean:
    case Pooling::kMeanSqrtLen:
      return PoolRows::kAll;
    case Pooling::kCls:
      return start == 0 ? PoolRows::kFirst : PoolRows::kNone;
    case Pooling::kLastToken:
      return start + len == total ? PoolRows::kLast : PoolRows::kNone;
  }
  return PoolRows::kNone;
}

int64_t max_embedding_tokens(const Model& model, const EmbeddingConfig& config) {
  int64_t limit = model.context_limit();
  if (config.max_seq_length > 0) limit = std::min(limit, config.max_seq_length);
  if (requires_single_chunk_prefill(model.config())) limit = std::min(limit, model.max_rows());
  return limit;
}

void check_dimensions(const EmbeddingConfig& config, int64_t dimensions) {
  METRALE_CHECK(dimensions >= 0 && dimensions <= config.dimension, "dimensions ", dimensions,
                " is outside [1, ", config.dimension, "] (the model's embedding has ",
                config.dimension, " values)");
}

std::vector<float> finish_embedding(const EmbeddingConfig& config, std::span<const float> sum,
                                    int64_t count, int64_t dimensions) {
  check_dimensions(config, dimensions);
  METRALE_CHECK(static_cast<int64_t>(sum.size()) == config.dimension && count >= 1,
                "finish_embedding: a sum of ", sum.size(), " values over ", count,
                " rows; expected ", config.dimension, " over at least one");
  const auto d = static_cast<size_t>(dimensions > 0 ? dimensions : config.dimension);
  std::vector<float> x(sum.begin(), sum.begin() + static_cast<ptrdiff_t>(d));
  // sentence-transformers' Pooling: the sum over the mask divided by the token count, in f32.
  if (config.pooling == Pooling::kMean || config.pooling == Pooling::kMeanSqrtLen) {
    const auto n = static_cast<float>(count);
    const float div = config.pooling == Pooling::kMean ? n : std::sqrt(n);
    for (float& v : x) v /= div;
  }
  if (config.normalize) {
    double ss = 0;
    for (const float v : x) ss += static_cast<double>(v) * v;
    const float norm = std::max(static_cast<float>(std::sqrt(ss)), 1e-12f);
    for (float& v : x) v /= norm;
  }
  return x;
}

std::vector<std::vector<float>> embed(Model& model, const EmbeddingConfig& config,
                                      std::span<const std::vector<int32_t>> inputs,
                                      int64_t dimensions) {
  check_dimensions(config, dimensions);
  const int64_t H = model.config().hidden_size;
  METRALE_CHECK(config.dimension == H, config.source, ": an embedding of ", config.dimension,
                " values for a model of hidden size ", H);
  const int64_t limit = max_embedding_tokens(model, config);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto n = static_cast<int64_t>(inputs[i].size());
    METRALE_CHECK(n >= 1, "input ", i, " has no tokens");
    METRALE_CHECK(n <= limit, "input ", i, " has ", n, " tokens; at most ", limit, " fit (",
                  config.max_seq_length > 0 && config.max_seq_length == limit
                      ? "sentence_bert_config.json's max_seq_length"
                      : "the model's context",
                  ")");
    for (size_t j = 0; j < inputs[i].size(); ++j) {
      const int32_t id = inputs[i][j];
      METRALE_CHECK(id >= 0 && id < model.vocab_size(), "input ", i, ": token ", j, " is ", id,
                    ", outside the vocabulary [0, ", model.vocab_size(), ")");
    }
  }
  const bool one_chunk = requires_single_chunk_prefill(model.config());
  const int64_t max_rows = model.max_rows();
  // Hybrid models: every sequence of a step holds a state slot.
  const auto max_items = static_cast<size_t>(
      model.state_pool() != nullptr ? model.state_pool()->plan().max_seqs : max_rows);
  const bool means = config.pooling == Pooling::kMean || config.pooling == Pooling::kMeanSqrtLen;

  const size_t n = inputs.size();
  std::vector<Sequence> seqs(n);  // never resized: a sequence's state slot is bound to it
  std::vector<std::vector<float>> sums(n), out(n);
  std::vector<int64_t> done(n, 0);
  std::vector<StepItem> items;
  std::vector<size_t> owner;
  std::vector<float> pooled;
  size_t next = 0;  // the first input not finished; only it may be part way through
  try {
    while (next < n) {
      items.clear();
      owner.clear();
      int64_t rows = 0;
      for (size_t i = next; i < n && rows < max_rows && items.size() < max_items; ++i) {
        const auto total = static_cast<int64_t>(inputs[i].size());
        const int64_t left = total - done[i];
        const int64_t len = std::min(left, max_rows - rows);
        if (one_chunk && len < left) break;
        items.push_back({.seq = &seqs[i],
                         .ids = std::span(inputs[i]).subspan(static_cast<size_t>(done[i]),
                                                             static_cast<size_t>(len)),
                         .logits = LogitRows::kNone,
                         .pool = pooled_rows(config.pooling, done[i], len, total)});
        owner.push_back(i);
        rows += len;
      }
      size_t k = 0;
      for (const StepItem& it : items) k += it.pool != PoolRows::kNone ? 1 : 0;
      pooled.assign(k * static_cast<size_t>(H), 0.0f);
      k = 0;
      for (size_t j = 0; j < items.size(); ++j) {
        if (items[j].pool == PoolRows::kNone) continue;
        const std::vector<float>& s = sums[owner[j]];  // a mean carried from earlier chunks
        if (!s.empty())
          std::copy(s.begin(), s.end(), pooled.begin() + static_cast<ptrdiff_t>(k * H));
        ++k;
      }
      model.step(items, {}, nullptr, pooled);
      k = 0;
      for (size_t j = 0; j < items.size(); ++j) {
        const size_t i = owner[j];
        done[i] += static_cast<int64_t>(items[j].ids.size());
        if (items[j].pool != PoolRows::kNone) {
          const auto row = pooled.begin() + static_cast<ptrdiff_t>(k++ * H);
          sums[i].assign(row, row + H);
        }
        if (done[i] == static_cast<int64_t>(inputs[i].size())) {
          out[i] = finish_embedding(config, sums[i], means ? done[i] : 1, dimensions);
          model.release(seqs[i]);
          sums[i] = {};
        }
      }
      while (next < n && done[next] == static_cast<int64_t>(inputs[next].size())) ++next;
    }
  } catch (...) {
    for (Sequence& s : seqs) model.release(s);
    throw;
  }
  return out;
}

}  // namespace metrale
