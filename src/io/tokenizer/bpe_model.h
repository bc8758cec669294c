#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE"}), merging exactly as HF's
// `tokenizers` does: a min-heap on (merge rank, position), stale entries recognised by the
// merged id. Byte-level tokenizers hand the model raw bytes, read through a per-byte id table,
// so the GPT-2 character mapping is never materialised on the hot path.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/json/json_fields.h"

namespace metrale::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// (left id, right id) -> (rank, merged id), open addressing: the lookup of the merge loop.
class PairMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  void insert_or_assign(int32_t a, int32_t b, Value v);
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  // Parses the "model" object.
  static std::unique_ptr<BpeModel> from_json(const JsonFields& j);

  // Appends the ids of one pre-tokenized word. With `byte_level`, `word` is raw bytes and each
  // byte stands for its GPT-2 character.
  void tokenize(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  // Number of vocabulary entries (HF's get_vocab_size of the model).
  size_t vocab_size() const { return vocab_.size(); }
  // Largest id in the vocabulary plus one.
  size_t id_limit() const { return id_to_token_.size(); }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;  // 0 once merged into its left neighbour
  };
  void merge_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;
  // Adds the symbol(s) for one character `s` (already carrying prefix/suffix) of `byte_len`
  // input bytes: vocabulary hit, else <0xNN> byte fallback, else unk (fused or not), else
  // dropped, in HF's order.
  void add_char_slow(std::string_view s, uint32_t byte_len, std::vector<Symbol>& syms,
                     std::optional<std::pair<int32_t, uint32_t>>& unk) const;
  void merge_all(std::vector<Symbol>& syms) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  PairMap merges_;
  std::optional<std::string> unk_token_, prefix_, suffix_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_fallback_ids_{};  // id of "<0xNN>" or -1
  // Id of each byte's GPT-2 character, by position in the word: [first][last] (prefix and
  // suffix make them differ); -1 when the character is not in the vocabulary.
  std::array<std::array<int32_t, 256>, 4> byte_ids_{};

  // Per-word cache (HF keeps one too). Guarded by try_lock: a busy cache is skipped, not waited on.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxWord = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace metrale::tok
