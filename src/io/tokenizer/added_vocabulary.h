#pragma once
// Added tokens (tokenizer.json "added_tokens"): ids assigned as HF's add_tokens does, and the
// leftmost-longest matching that cuts them out of the text before pre-tokenization, with
// lstrip / rstrip / single_word / normalized semantics.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "io/json/json_fields.h"
#include "io/tokenizer/bpe_model.h"
#include "io/tokenizer/normalizer.h"
#include "io/tokenizer/pipeline.h"

namespace metrale::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  // `content` after the normalizer when `normalized`; what matching and decoding use.
  std::string normalized_content;
};

class AddedVocabulary {
 public:
  // Parses "added_tokens" and assigns ids like HF: an existing id (added or model vocabulary)
  // when the content is known, else the next free id after the model's vocabulary. The ids
  // written in the JSON are not trusted, exactly as HF ignores them.
  void load(const JsonList& list, const BpeModel& model, const Normalizer* normalizer);

  // Cuts the tokens of one set (normalized or not) out of `s`, appending pieces to `out`.
  void split(const Split& s, bool normalized_set, std::vector<Split>& out) const;

  std::optional<int32_t> token_to_id(std::string_view content) const;
  // The token HF's decode sees for `id` (normalized content for normalized tokens), or null.
  const std::string* id_to_token(int32_t id) const;
  const AddedToken* by_id(int32_t id) const;
  bool is_special_content(std::string_view token) const {
    return special_.count(std::string(token)) != 0;
  }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Matcher {
    std::vector<std::pair<std::string, int32_t>> patterns;
    // Pattern indices by first byte, longest first, so the first hit is the longest.
    std::array<std::vector<uint32_t>, 256> by_first_byte;
    bool any = false;
    void build(const std::string& where);
  };
  void rebuild_matchers(const std::string& where);

  std::vector<AddedToken> tokens_;  // in insertion order
  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, size_t> by_id_;  // -> index in tokens_
  std::unordered_set<std::string> special_;
  Matcher plain_, normalized_;
};

}  // namespace metrale::tok
