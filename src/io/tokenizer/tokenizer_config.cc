#include "io/tokenizer/tokenizer_config.h"

#include "core/json_parse.h"
#include "io/tokenizer/json_util.h"

namespace metrale {

using tok::Json;

TokenizerConfig parse_tokenizer_config(std::string_view json_text, std::string_view origin) {
  const Json j = parse_json(json_text, origin);
  const std::string where(origin);
  METRALE_CHECK(j.is_object(), where, ": expected a JSON object, found ", tok::describe(j));
  TokenizerConfig c;
  // A special token is a plain string or an AddedToken object {"content": ...}.
  auto token = [&](const char* key) -> std::optional<std::string> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    return tok::get_string(*it, "content", where + "." + key);
  };
  c.bos_token = token("bos_token");
  c.eos_token = token("eos_token");
  c.pad_token = token("pad_token");
  c.unk_token = token("unk_token");
  auto flag = [&](const char* key) -> std::optional<bool> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    METRALE_CHECK(it->is_boolean(), where, ".", key, ": expected a boolean, found ", tok::describe(*it));
    return it->get<bool>();
  };
  c.add_bos_token = flag("add_bos_token");
  c.add_eos_token = flag("add_eos_token");
  if (auto it = j.find("tokenizer_class"); it != j.end() && it->is_string()) c.tokenizer_class = it->get<std::string>();
  if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else {
      METRALE_CHECK(it->is_array(), where, ".chat_template: expected a string or a list of {name, template}, found ",
                    tok::describe(*it));
      for (size_t i = 0; i < it->size(); ++i) {
        const std::string at = where + ".chat_template[" + std::to_string(i) + "]";
        c.named_templates[tok::get_string((*it)[i], "name", at)] = tok::get_string((*it)[i], "template", at);
      }
      if (auto d = c.named_templates.find("default"); d != c.named_templates.end()) c.chat_template = d->second;
    }
  }
  return c;
}

}  // namespace metrale
