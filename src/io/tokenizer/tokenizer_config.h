#pragma once
// tokenizer_config.json: the few fields a runtime needs (special token names, bos/eos flags,
// the raw chat template). No Jinja rendering here.
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace metrale {

struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;
  std::optional<std::string> chat_template;            // the default template
  std::map<std::string, std::string> named_templates;  // when the file lists several
  std::optional<std::string> tokenizer_class;
};

// Parses tokenizer_config.json text; `origin` names it in errors.
TokenizerConfig parse_tokenizer_config(std::string_view json_text, std::string_view origin);

}  // namespace metrale
