#include "chat/chat_template.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/json/json_fields.h"
#include "io/json/json_parse.h"

namespace metrale::chat {
namespace {

// transformers' SPECIAL_TOKENS_ATTRIBUTES: what special_tokens_map passes to the template.
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  METRALE_CHECK(in, path.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A message as transformers hands it to the template: null-valued keys dropped, then the
// reasoning aliased as {"thinking": r, **message, "reasoning_content": r}.
Value normalize_message(const Value& m, size_t index) {
  if (!m.is_dict()) {
    throw make_error("messages[", index, "]: chat messages must be objects, found ", type_name(m));
  }
  Value kept = Value::dict();
  for (const auto& [key, value] : m.as_dict().items()) {
    if (!value.is_none()) kept.as_dict().set(key, value);
  }
  const Value* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    if ((reasoning = kept.as_dict().find(key)) != nullptr) break;
  }
  if (reasoning == nullptr) return kept;
  const Value r = *reasoning;
  Value out = Value::dict();
  out.as_dict().set("thinking", r);
  for (const auto& [key, value] : kept.as_dict().items()) out.as_dict().set(key, value);
  out.as_dict().set("reasoning_content", r);
  return out;
}

}  // namespace

ChatRequest ChatRequest::from_json(std::string_view json_text, std::string_view source) {
  const Value doc = value_from_json(json_text, source);
  const std::string src(source);
  METRALE_CHECK(doc.is_dict(), src, ": expected a JSON object at the top level, found ",
                type_name(doc));
  ChatRequest r;
  for (const auto& [key, value] : doc.as_dict().items()) {
    if (key == "messages") {
      METRALE_CHECK(value.is_list(), src, ": field 'messages': expected a list, found ",
                    type_name(value));
      r.messages = value;
    } else if (key == "tools") {
      METRALE_CHECK(value.is_list() || value.is_none(), src,
                    ": field 'tools': expected a list or null, found ", type_name(value));
      r.tools = value;
    } else if (key == "add_generation_prompt") {
      METRALE_CHECK(value.is_bool(), src,
                    ": field 'add_generation_prompt': expected a bool, found ", type_name(value));
      r.add_generation_prompt = value.as_bool();
    } else if (key == "chat_template_kwargs") {
      METRALE_CHECK(value.is_dict() || value.is_none(), src,
                    ": field 'chat_template_kwargs': expected an object, found ", type_name(value));
      if (value.is_dict()) r.kwargs = value.as_dict();
    } else {
      throw make_error(src, ": unknown field '", key,
                       "' (expected messages, tools, add_generation_prompt, chat_template_kwargs)");
    }
  }
  return r;
}

ChatTemplate ChatTemplate::from_string(std::string_view text, std::string source_name,
                                       std::map<std::string, std::string> special_tokens) {
  ChatTemplate t;
  t.templates_.emplace("", Template(text, std::move(source_name)));
  t.special_tokens_ = std::move(special_tokens);
  return t;
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir,
                                std::optional<std::string> name) {
  ChatTemplate t;
  t.chosen_ = std::move(name);
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (std::filesystem::exists(config_path)) {
    config = parse_json(read_file(config_path), config_path.string());
  }
  const JsonFields j(config, config_path.string());
  for (const char* key : kSpecialTokens) {
    const nlohmann::json* v = j.find(key);
    if (v == nullptr) continue;
    if (v->is_string()) {
      t.special_tokens_[key] = v->get<std::string>();
    } else {  // an AddedToken object
      t.special_tokens_[key] = j.req_object(key).req_string("content");
    }
  }
  const std::filesystem::path jinja_path = model_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    t.templates_.emplace("", Template(read_file(jinja_path), jinja_path.string()));
  } else if (const nlohmann::json* v = j.find("chat_template"); v != nullptr && v->is_string()) {
    t.templates_.emplace("", Template(v->get<std::string>(), j.where("chat_template")));
  } else if (v != nullptr) {
    if (!v->is_array()) {
      throw j.error("chat_template", "expected a string or a list of {name, template}, found ",
                    describe_json_value(*v));
    }
    const JsonList list = j.req_list("chat_template");
    for (size_t i = 0; i < list.size(); ++i) {
      const JsonFields item = list.object(i);
      const std::string item_name = item.req_string("name");
      t.templates_.emplace(item_name,
                           Template(item.req_string("template"), item.where("template")));
    }
  } else {
    throw make_error(model_dir.string(),
                     ": no chat template (neither chat_template.jinja nor "
                     "tokenizer_config.json's chat_template)");
  }
  if (t.chosen_ && !t.templates_.count(*t.chosen_)) {
    throw make_error(config_path.string(), ": no chat template named '", *t.chosen_, "'");
  }
  return t;
}

std::vector<std::string> ChatTemplate::names() const {
  std::vector<std::string> out;
  for (const auto& [n, tmpl] : templates_) out.push_back(n);
  return out;
}

const Template& ChatTemplate::pick(bool with_tools) const {
  if (templates_.size() == 1 && templates_.count("")) return templates_.at("");
  if (chosen_) return templates_.at(*chosen_);
  if (with_tools && templates_.count("tool_use")) return templates_.at("tool_use");
  if (templates_.count("default")) return templates_.at("default");
  throw make_error(
      "the checkpoint has several chat templates and none is named 'default'; "
      "choose one by name");
}

std::string ChatTemplate::render(const ChatRequest& request, const RenderOptions& options) const {
  const Template* tmpl = &pick(!request.tools.is_none());
  METRALE_CHECK(request.messages.is_list(), "chat request: messages must be a list");
  const List& in = request.messages.as_list();
  METRALE_CHECK(!in.empty(), "chat request: cannot apply a chat template to an empty conversation");
  List messages;
  for (size_t i = 0; i < in.size(); ++i) messages.push_back(normalize_message(in[i], i));
  if (request.tools.is_list()) {
    for (size_t i = 0; i < request.tools.as_list().size(); ++i) {
      METRALE_CHECK(request.tools.as_list()[i].is_dict(), "chat request: tools[", i,
                    "] must be a JSON schema object");
    }
  }
  Dict context;
  context.set("messages", Value::list(std::move(messages)));
  context.set("tools", request.tools);
  context.set("documents", Value(None{}));
  context.set("add_generation_prompt", Value(request.add_generation_prompt));
  for (const auto& [key, value] : special_tokens_) context.set(key, Value(value));
  for (const auto& [key, value] : request.kwargs.items()) {
    METRALE_CHECK(
        key != "messages" && key != "tools" && key != "documents" && key != "add_generation_prompt",
        "chat request: chat_template_kwargs may not set '", key, "'");
    context.set(key, value);
  }
  return tmpl->render(context, options);
}

}  // namespace metrale::chat
