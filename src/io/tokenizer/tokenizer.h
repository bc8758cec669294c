#pragma once
// HuggingFace tokenizer.json: load, encode, decode — equal to the Rust `tokenizers` package
// (the oracle of tests/io/tokenizer), for BPE models (byte-level and SentencePiece-style).
//
// Input text is bytes. Invalid UTF-8 is not rejected: every maximal invalid subsequence is
// replaced by U+FFFD first (Python's bytes.decode("utf-8", "replace")), so encode(bytes) equals
// tokenizers' encode of that decoded string.
//
// Differences from `tokenizers`, all deliberate: decode() throws on an id that is not in the
// vocabulary (HF silently drops it); BPE dropout is refused at load.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/tokenizer_config.h"

namespace metrale {

struct AddedTokenInfo {
  std::string content;
  int32_t id;
  bool special;
  bool single_word, lstrip, rstrip, normalized;
};

class Tokenizer {
 public:
  // Loads tokenizer.json; also reads tokenizer_config.json from the same folder when present.
  static Tokenizer from_file(const std::string& path);
  // Parses tokenizer.json text; `origin` names it in errors.
  static Tokenizer from_json(std::string_view json_text,
                             std::string_view origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`; with add_special_tokens the post-processor's tokens (e.g. bos) too.
  // Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Text of `ids`. Throws Error naming the position and value of an id that is not in the
  // vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // Distinct tokens, added ones included (HF get_vocab_size(with_added_tokens=True)).
  size_t vocab_size() const;
  // One past the largest id (the rows an embedding table needs at least).
  size_t id_limit() const;

  const std::vector<AddedTokenInfo>& added_tokens() const;
  bool is_special(int32_t id) const;

  // bos/eos: tokenizer_config.json's bos_token/eos_token when given, else what the
  // post-processor puts before/after a sequence.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // Whether encode(text, true) already adds bos (the post-processor does).
  bool post_processor_adds_bos() const;

  const TokenizerConfig& config() const;
  void set_config(TokenizerConfig config);

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace metrale
