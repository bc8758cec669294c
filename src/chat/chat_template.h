#pragma once
// A checkpoint's chat template, rendered as transformers' `apply_chat_template(messages,
// tools=..., add_generation_prompt=..., tokenize=False, **kwargs)` renders it, byte for byte:
// the same message normalisation (keys whose value is null are dropped; reasoning_content /
// thinking / reasoning are aliased), the tokenizer's named special tokens as variables
// (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token, where set),
// and the template variables messages, tools, documents (None), add_generation_prompt.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "chat/template.h"
#include "chat/value.h"

namespace metrale::chat {

struct ChatRequest {
  Value messages = Value::list();  // a list of message dicts (content: a string or a list of parts)
  Value tools = Value(None{});     // a list of JSON schemas, or None
  bool add_generation_prompt = false;
  Dict kwargs;  // further template variables (enable_thinking, ...); they override special tokens

  // {"messages": [...], "tools": [...] (optional), "add_generation_prompt": bool (optional),
  //  "chat_template_kwargs": {...} (optional)}; any other field is an Error naming `source`.
  static ChatRequest from_json(std::string_view json_text, std::string_view source);
};

class ChatTemplate {
 public:
  // Reads `model_dir`/chat_template.jinja when present (it wins, as in transformers), else
  // tokenizer_config.json's chat_template: a string, or a list of {name, template} from which
  // render() picks `name` when given, else "tool_use" for a request with tools when there is
  // one, else "default". Special tokens come from tokenizer_config.json (when present).
  static ChatTemplate load(const std::filesystem::path& model_dir,
                           std::optional<std::string> name = {});

  // A template from text; `source_name` names it in errors.
  static ChatTemplate from_string(std::string_view text, std::string source_name,
                                  std::map<std::string, std::string> special_tokens = {});

  std::string render(const ChatRequest& request, const RenderOptions& options = {}) const;

  // The template a request renders: the single one; else the chosen name; else "tool_use"
  // for a request with tools when there is one; else "default" (an Error when none is).
  const Template& pick(bool with_tools) const;

  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  // The names of the templates a list-form chat_template holds ("" for the single one).
  std::vector<std::string> names() const;

 private:
  std::map<std::string, Template> templates_;  // "" for a single template
  std::optional<std::string> chosen_;
  std::map<std::string, std::string> special_tokens_;
};

}  // namespace metrale::chat
