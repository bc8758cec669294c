#pragma once
// How a checkpoint turns its hidden states into one embedding per input, read from the files
// sentence-transformers keeps beside the model:
//
//   modules.json                        the pipeline, in order: a Transformer (the model at the
//                                       directory's root), a Pooling module, optionally a
//                                       Normalize module; any other module is refused
//   <Pooling path>/config.json          the pooling mode (1_Pooling/config.json), in the legacy
//                                       form (pooling_mode_lasttoken: true, ...) or the
//                                       current one (pooling_mode: "lasttoken")
//   sentence_bert_config.json           the Transformer's max_seq_length and do_lower_case
//                                       (max_seq_length else tokenizer_config.json's
//                                       model_max_length, as sentence-transformers falls back)
//   config_sentence_transformers.json   a default prompt or truncate_dim would change every
//                                       embedding: refused when set
//
// Without modules.json: last-token pooling and L2 normalisation — Qwen3-Embedding's pipeline and
// what vLLM gives a decoder model by default. (sentence-transformers itself would pool the
// last token of a causal LM and not normalise.) Every problem is an Error naming the file and
// field.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace metrale {

enum class Pooling : uint8_t {
  kLastToken,    // the last token's hidden state
  kMean,         // the mean over the input's tokens
  kCls,          // the first token's
  kMeanSqrtLen,  // the sum over the tokens divided by sqrt(their count)
};
// sentence-transformers' names: "lasttoken", "mean", "cls", "mean_sqrt_len_tokens".
std::string_view pooling_name(Pooling p);

struct EmbeddingConfig {
  Pooling pooling = Pooling::kLastToken;
  bool normalize = true;       // L2-normalise the pooled vector (the Normalize module)
  int64_t dimension = 0;       // the embedding's width: the model's hidden size
  int64_t max_seq_length = 0;  // the longest input sentence-transformers takes; 0: none given
  // Where it came from: the modules.json path, or "default (no modules.json)".
  std::string source;
};

// Reads dir's sentence-transformers files (above) for a model of `hidden_size`.
EmbeddingConfig load_embedding_config(const std::filesystem::path& dir, int64_t hidden_size);

}  // namespace metrale
