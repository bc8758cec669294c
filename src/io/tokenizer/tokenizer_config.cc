#include "io/tokenizer/tokenizer_config.h"

#include <nlohmann/json.hpp>

#include "io/json/json_fields.h"
#include "io/json/json_parse.h"

namespace metrale {

TokenizerConfig parse_tokenizer_config(std::string_view json_text, std::string_view origin) {
  const nlohmann::json doc = parse_json(json_text, origin);
  const JsonFields j(doc, std::string(origin));
  TokenizerConfig c;
  // A special token is a plain string or an AddedToken object {"content": ...}.
  auto token = [&](const char* key) -> std::optional<std::string> {
    const nlohmann::json* v = j.find(key);
    if (v == nullptr || v->is_string()) return j.opt_string(key);
    return j.req_object(key).req_string("content");
  };
  c.bos_token = token("bos_token");
  c.eos_token = token("eos_token");
  c.pad_token = token("pad_token");
  c.unk_token = token("unk_token");
  c.add_bos_token = j.opt_bool("add_bos_token");
  c.add_eos_token = j.opt_bool("add_eos_token");
  c.tokenizer_class = j.opt_string("tokenizer_class");
  if (const nlohmann::json* v = j.find("chat_template"); v != nullptr && v->is_string()) {
    c.chat_template = v->get<std::string>();
  } else if (v != nullptr) {
    if (!v->is_array()) {
      throw j.error("chat_template", "expected a string or a list of {name, template}, found ",
                    describe_json_value(*v));
    }
    const JsonList list = j.req_list("chat_template");
    for (size_t i = 0; i < list.size(); ++i) {
      const JsonFields t = list.object(i);
      c.named_templates[t.req_string("name")] = t.req_string("template");
    }
    if (auto d = c.named_templates.find("default"); d != c.named_templates.end())
      c.chat_template = d->second;
  }
  return c;
}

}  // namespace metrale
