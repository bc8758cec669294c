#pragma once
// Embeddings from a decoder model, as sentence-transformers computes them for a checkpoint such
// as Qwen3-Embedding: each input's tokens go through the model, the hidden states after the
// final norm are pooled as the checkpoint's EmbeddingConfig says (engine/embedding_config.h),
// and the pooled vector is L2-normalised when its pipeline has a Normalize module.
//
// The pooling runs in the model's pass (StepItem::pool: the rows' final-norm hidden states
// summed by Backend::segment_sum), so embedding inputs share steps with one another and, in
// the server, with generation rows. What is left is the small per-input arithmetic on the
// pooled sum: the mean's division, the optional truncation to `dimensions` and the
// normalisation — like sampling, on the pass's output rather than between its ops.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/embedding_config.h"
#include "engine/model.h"

namespace metrale {

// Which rows of the chunk [start, start + len) of an input of `total` tokens are pooled:
// every row for the means, the input's first token for cls, its last for lasttoken (kNone for
// a chunk without it).
PoolRows pooled_rows(Pooling pooling, int64_t start, int64_t len, int64_t total);

// The most tokens one input may have: the model's context, sentence_bert_config.json's
// max_seq_length when smaller (sentence-transformers would cut the input there; metrale refuses
// it instead of embedding a different text), and max_rows for models that prefill in one chunk.
int64_t max_embedding_tokens(const Model& model, const EmbeddingConfig& config);

// Throws unless `dimensions` is 0 (the whole embedding) or in [1, config.dimension].
void check_dimensions(const EmbeddingConfig& config, int64_t dimensions);

// The embedding from `sum`, the sum of the pooled rows' final hidden states over `count` rows:
// divided by count (mean) or sqrt(count) (mean_sqrt_len_tokens), cut to its first `dimensions`
// values (0: all), then L2-normalised when config.normalize (x / max(|x|, 1e-12), as
// torch.nn.functional.normalize). Cutting before normalising is the Matryoshka form OpenAI's
// and vLLM's `dimensions` give: a unit vector of the requested width.
std::vector<float> finish_embedding(const EmbeddingConfig& config, std::span<const float> sum,
                                    int64_t count, int64_t dimensions);

// Embeds every input (token ids; each non-empty, within max_embedding_tokens and the
// vocabulary, else an Error naming the input) in as few steps as the model's max_rows allow:
// many inputs per step, a long one over several (its chunks continue one pooled sum). Hybrid
// models: at most as many inputs per step as the state pool has slots. The model's other
// sequences are untouched; every sequence used here is released.
std::vector<std::vector<float>> embed(Model& model, const EmbeddingConfig& config,
                                      std::span<const std::vector<int32_t>> inputs,
                                      int64_t dimensions = 0);

}  // namespace metrale
