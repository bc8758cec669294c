// The request side of the OpenAI wire format (openai_api.h): bodies parsed and validated into
// an OpenAiRequest, then a ServeRequest (the grammar a forced tool call needs:
// forced_tool_call.cc).
#include "http/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>

#include "http/openai_fields.h"
#include "io/json/json_fields.h"
#include "io/json/json_parse.h"
#include "io/tokenizer/tokenizer.h"
#include "io/tokenizer/utf8.h"

namespace metrale::http {

using fields::bad;
using fields::describe_key;
using fields::field;
using fields::json;
using fields::kSource;
using fields::parse_body;
using fields::unsupported;

namespace {

// The fields both APIs share: sampling, stop, stream, and the refused-unless-default ones.
void read_common(const JsonFields& f, OpenAiRequest& r) {
  if (auto m = field("model", [&] { return f.opt_string("model"); })) r.model = *m;
  if (auto t = field("temperature", [&] { return f.opt_number_in("temperature", 0.0, 2.0); })) {
    r.sampling.temperature = static_cast<float>(*t);
  }
  if (auto p = field("top_p", [&] { return f.opt_number_in("top_p", 0.0, 1.0); })) {
    if (*p <= 0.0) throw bad("top_p", "expected a number in (0, 1], found 0");
    r.sampling.top_p = static_cast<float>(*p);
  }
  // vLLM's extensions: top_k (-1 or 0: off), min_p, repetition_penalty, ignore_eos.
  if (auto k = field("top_k", [&] { return f.opt_int_in("top_k", -1, int64_t{1} << 30); })) {
    r.sampling.top_k = std::max<int64_t>(*k, 0);
  }
  if (auto p = field("min_p", [&] { return f.opt_number_in("min_p", 0.0, 1.0); })) {
    r.sampling.min_p = static_cast<float>(*p);
  }
  if (auto p = field("repetition_penalty",
                     [&] { return f.opt_number_in("repetition_penalty", 0.01, 100.0); })) {
    r.sampling.repetition_penalty = static_cast<float>(*p);
  }
  r.ignore_eos = field("ignore_eos", [&] { return f.bool_or("ignore_eos", false); });
  r.speculative = field("speculative", [&] { return f.bool_or("speculative", true); });
  // SGLang-style: the conversation this request continues (MTP carry).
  if (auto s = field("session_id", [&] { return f.opt_string("session_id"); })) {
    r.session = std::move(*s);
  }
  r.skip_special_tokens =
      field("skip_special_tokens", [&] { return f.opt_bool("skip_special_tokens"); });
  if (auto s = field("seed", [&] { return f.opt_int("seed"); })) {
    r.seed = static_cast<uint64_t>(*s);
  }

  if (const json* stop = f.find("stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopStrings) {
        throw bad("stop", "at most " + std::to_string(kMaxStopStrings) + " stop strings, found " +
                              std::to_string(stop->size()));
      }
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) {
          throw bad("stop", "item " + std::to_string(i) + ": expected a string, found " +
                                describe_json_value((*stop)[i]));
        }
        r.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      throw bad("stop",
                "expected a string or a list of strings, found " + describe_json_value(*stop));
    }
    for (const std::string& s : r.stop) {
      if (s.empty()) throw bad("stop", "a stop string is empty");
      if (s.size() > kMaxStopBytes) {
        throw bad("stop",
                  "a stop string is longer than " + std::to_string(kMaxStopBytes) + " bytes");
      }
    }
  }

  if (auto n = field("n", [&] { return f.opt_int_in("n", 1, kMaxChoices); })) {
    r.n = static_cast<int>(*n);
  }
  r.stream = field("stream", [&] { return f.bool_or("stream", false); });
  if (auto so = field("stream_options", [&] { return f.opt_object("stream_options"); })) {
    if (!r.stream) throw bad("stream_options", "only allowed when stream is true");
    r.include_usage = field("stream_options", [&] { return so->bool_or("include_usage", false); });
  }
  // OpenAI's penalties over the counts of generated tokens (the scheduler applies them).
  if (auto p = field("presence_penalty",
                     [&] { return f.opt_number_in("presence_penalty", -2.0, 2.0); })) {
    r.presence_penalty = static_cast<float>(*p);
  }
  if (auto p = field("frequency_penalty",
                     [&] { return f.opt_number_in("frequency_penalty", -2.0, 2.0); })) {
    r.frequency_penalty = static_cast<float>(*p);
  }
  // OpenAI's logit_bias: {"<token id>": bias in [-100, 100]}; null or {} is no bias.
  if (const json* lb = f.find("logit_bias"); lb != nullptr && !lb->is_null()) {
    if (!lb->is_object())
      throw bad("logit_bias", "expected an object, found " + describe_json_value(*lb));
    if (lb->size() > kMaxLogitBias) {
      throw bad("logit_bias", "at most " + std::to_string(kMaxLogitBias) + " entries, found " +
                                  std::to_string(lb->size()));
    }
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      const json& value = it.value();
      // Decimal digits only (no sign, space or exponent), within int32.
      int64_t id = 0;
      bool is_id = !key.empty() && key.size() <= 10;
      for (char c : key) {
        if (c < '0' || c > '9') {
          is_id = false;
          break;
        }
        id = id * 10 + (c - '0');
      }
      if (!is_id || id > int64_t{INT32_MAX}) {
        throw bad("logit_bias", "keys must be token ids (non-negative integers), found \"" +
                                    describe_key(key) + "\"");
      }
      if (!value.is_number()) {
        throw bad("logit_bias", "token " + key + ": expected a number in [-100, 100], found " +
                                    describe_json_value(value));
      }
      const double bias = value.get<double>();
      if (!(bias >= -100.0 && bias <= 100.0)) {
        throw bad("logit_bias", "token " + key + ": expected a number in [-100, 100], found " +
                                    describe_json_value(value));
      }
      r.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
    }
    std::sort(r.logit_bias.begin(), r.logit_bias.end());
    for (size_t i = 1; i < r.logit_bias.size(); ++i) {
      if (r.logit_bias[i].first == r.logit_bias[i - 1].first) {  // "5" and "05"
        throw bad("logit_bias",
                  "token " + std::to_string(r.logit_bias[i].first) + " appears more than once");
      }
    }
  }
  field("user", [&] { return f.opt_string("user"); });  // typed, otherwise ignored
}

// The structured-output fields (both endpoints): response_format, structured_outputs and the
// guided_* ones; at most one of them. `body` is re-read in key order for a schema (a schema's
// property order is the order the output writes them).
void read_structured(const json& doc, std::string_view body, OpenAiRequest& r) {
  std::vector<std::string> given;
  for (const char* key : {"response_format", "structured_outputs", "guided_json", "guided_regex",
                          "guided_choice", "guided_grammar"}) {
    if (doc.contains(key) && !doc[key].is_null()) given.emplace_back(key);
  }
  if (given.empty()) return;
  if (given.size() > 1) {
    throw bad(given[1],
              "only one of response_format, structured_outputs and guided_* may be "
              "given; found '" +
                  given[0] + "' and '" + given[1] + "'");
  }
  const std::string& key = given[0];
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body);
  const nlohmann::ordered_json& v = ordered[key];
  auto schema_text = [&](const nlohmann::ordered_json& s, const std::string& where) {
    if (s.is_string()) return s.get<std::string>();
    if (!s.is_object() && !s.is_boolean()) {
      throw bad(where, "expected a JSON schema (an object, or its JSON text), found " +
                           describe_json_value(json::parse(s.dump())));
    }
    return s.dump();
  };
  auto string_of = [&](const nlohmann::ordered_json& s, const std::string& where) {
    if (!s.is_string())
      throw bad(where, "expected a string, found " + describe_json_value(json::parse(s.dump())));
    if (s.get<std::string>().empty()) throw bad(where, "the string is empty");
    return s.get<std::string>();
  };
  auto choices_of = [&](const nlohmann::ordered_json& s, const std::string& where) {
    if (!s.is_array() || s.empty()) throw bad(where, "expected a non-empty list of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (!s[i].is_string() || s[i].get<std::string>().empty())
        throw bad(where, "item " + std::to_string(i) + ": expected a non-empty string");
      out.push_back(s[i].get<std::string>());
    }
    return out;
  };
  GrammarSpec g;
  g.field = key;
  if (key == "response_format") {
    if (!v.is_object()) throw bad(key, "expected an object");
    if (!v.contains("type") || !v["type"].is_string())
      throw bad(key, "expected \"type\": \"text\", \"json_object\" or \"json_schema\"");
    const std::string type = v["type"].get<std::string>();
    if (type == "text") return;
    if (type == "json_object") {
      g.kind = GrammarSpec::Kind::kJsonObject;
    } else if (type == "json_schema") {
      const std::string at = "response_format.json_schema";
      if (!v.contains("json_schema") || !v["json_schema"].is_object())
        throw bad(at, "expected an object {name, schema, strict}");
      const nlohmann::ordered_json& js = v["json_schema"];
      if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean())
        throw bad(at + ".strict", "expected a boolean");
      if (js.contains("name") && !js["name"].is_null() && !js["name"].is_string())
        throw bad(at + ".name", "expected a string");
      if (!js.contains("schema") || js["schema"].is_null()) {
        g.kind = GrammarSpec::Kind::kJsonObject;  // OpenAI's: no schema is any JSON object
      } else {
        g.kind = GrammarSpec::Kind::kJsonSchema;
        g.text = schema_text(js["schema"], at + ".schema");
      }
    } else {
      throw bad(key, "type: expected \"text\", \"json_object\" or \"json_schema\", found \"" +
                         type + "\"");
    }
  } else if (key == "structured_outputs") {
    if (!v.is_object()) throw bad(key, "expected an object");
    std::vector<std::string> set;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it.value().is_null() || (it.value().is_boolean() && !it.value().get<bool>())) continue;
      const std::string& k = it.key();
      if (k == "json" || k == "regex" || k == "choice" || k == "grammar" || k == "json_object") {
        set.push_back(k);
      } else if (k == "structural_tag" || k == "whitespace_pattern" || k == "disable_fallback" ||
                 k == "disable_any_whitespace" || k == "disable_additional_properties") {
        throw unsupported(key + "." + k, "not supported");
      }
    }
    if (set.size() != 1) {
      throw bad(key, "expected exactly one of json, regex, choice, grammar, json_object; found " +
                         std::to_string(set.size()));
    }
    const std::string& k = set[0];
    g.field = key + "." + k;
    if (k == "json") {
      g.kind = GrammarSpec::Kind::kJsonSchema;
      g.text = schema_text(v[k], g.field);
    } else if (k == "regex") {
      g.kind = GrammarSpec::Kind::kRegex;
      g.text = string_of(v[k], g.field);
    } else if (k == "choice") {
      g.kind = GrammarSpec::Kind::kChoice;
      g.choices = choices_of(v[k], g.field);
    } else if (k == "grammar") {
      g.kind = GrammarSpec::Kind::kEbnf;
      g.text = string_of(v[k], g.field);
    } else {
      if (!v[k].is_boolean()) throw bad(g.field, "expected a boolean");
      g.kind = GrammarSpec::Kind::kJsonObject;
    }
  } else if (key == "guided_json") {
    g.kind = GrammarSpec::Kind::kJsonSchema;
    g.text = schema_text(v, key);
  } else if (key == "guided_regex") {
    g.kind = GrammarSpec::Kind::kRegex;
    g.text = string_of(v, key);
  } else if (key == "guided_choice") {
    g.kind = GrammarSpec::Kind::kChoice;
    g.choices = choices_of(v, key);
  } else {
    g.kind = GrammarSpec::Kind::kEbnf;
    g.text = string_of(v, key);
  }
  r.grammar = std::move(g);
}

// An assistant message's tool_calls[].function.arguments is JSON text in OpenAI's API; chat
// templates expect the object (Qwen3.5's iterates `arguments|items`). Text that holds a JSON
// object becomes that object, keys in order; anything else is left as it is (templates that
// print strings still can).
void arguments_as_objects(nlohmann::ordered_json& messages) {
  for (auto& m : messages) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
        continue;
      }
      auto& fn = call["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      const std::string text = fn["arguments"].get<std::string>();
      try {
        if (!parse_json(text, "arguments").is_object()) continue;  // depth-limited check
      } catch (const Error&) {
        continue;
      }
      fn["arguments"] = nlohmann::ordered_json::parse(text);
    }
  }
}

void read_max_tokens(const JsonFields& f, OpenAiRequest& r, bool is_chat) {
  // Chat: max_completion_tokens is the current name and wins; max_tokens the deprecated one.
  if (is_chat) {
    r.max_tokens = field("max_completion_tokens",
                         [&] { return f.opt_int_in("max_completion_tokens", 1, kMaxTokensCap); });
  }
  auto v = field("max_tokens", [&] { return f.opt_int_in("max_tokens", 1, kMaxTokensCap); });
  if (!r.max_tokens) r.max_tokens = v;
}

}  // namespace

ApiError::ApiError(int status, std::string message, std::string param, std::string type,
                   std::string code)
    : Error(std::move(message)),
      status_(status),
      param_(std::move(param)),
      type_(type.empty() ? error_type_for_status(status) : std::move(type)),
      code_(std::move(code)) {}

nlohmann::json ApiError::to_json() const {
  return json{{"error",
               {{"message", message()},
                {"type", type_},
                {"param", param_.empty() ? json(nullptr) : json(param_)},
                {"code", code_.empty() ? json(nullptr) : json(code_)}}}};
}

std::string error_type_for_status(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string error_body(int status, std::string_view message, std::string_view param,
                       std::string_view code) {
  return dump_json(
      ApiError(status, std::string(message), std::string(param), "", std::string(code)).to_json());
}

OpenAiRequest parse_chat_request(std::string_view body) {
  const json doc = parse_body(body);
  const JsonFields f = field("", [&] { return JsonFields(doc, std::string(kSource)); });
  OpenAiRequest r;
  r.kind = ApiKind::kChat;
  read_common(f, r);
  read_max_tokens(f, r, /*chat=*/true);

  const JsonList messages = field("messages", [&] { return f.req_list("messages"); });
  if (messages.size() == 0) throw bad("messages", "expected at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const JsonFields m = field("messages", [&] { return messages.object(i); });
    field("messages", [&] { return m.req_string("role"); });
    const json* content = m.find("content");
    if (content != nullptr && !content->is_string() && !content->is_array()) {
      throw bad("messages", "message " + std::to_string(i) +
                                ": content must be a string, a list of parts or null, found " +
                                describe_json_value(*content));
    }
  }
  if (const json* tools = f.find("tools"); tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) {
      throw bad("tools", "expected a list, found " + describe_json_value(*tools));
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object())
        throw bad("tools", at + ": expected an object, found " + describe_json_value(t));
      const json* type = t.contains("type") ? &t["type"] : nullptr;
      if (type == nullptr || !type->is_string() || *type != "function") {
        throw bad("tools", at + ": expected \"type\": \"function\"");
      }
      const json* fn = t.contains("function") ? &t["function"] : nullptr;
      if (fn == nullptr || !fn->is_object() || !fn->contains("name") ||
          !(*fn)["name"].is_string() || (*fn)["name"].get<std::string>().empty()) {
        throw bad("tools", at + ": expected \"function\": {\"name\": a non-empty string, ...}");
      }
      if (fn->contains("parameters") && !(*fn)["parameters"].is_object() &&
          !(*fn)["parameters"].is_null()) {
        throw bad("tools", at + ".function.parameters: expected a JSON schema object, found " +
                               describe_json_value((*fn)["parameters"]));
      }
    }
    r.tools = *tools;
  }
  // tool_choice: "auto" (the default with tools), "none" (no parsing; the tools are still
  // rendered, as vLLM does), "required" (one call of any tool) or {"type": "function",
  // "function": {"name": ...}}: the reply is constrained to a call (forced_tool_call_grammar).
  std::string tool_choice = "auto";
  if (const json* tc = f.find("tool_choice"); tc != nullptr && !tc->is_null()) {
    if (tc->is_object()) {
      const json* type = tc->contains("type") ? &(*tc)["type"] : nullptr;
      const json* fn = tc->contains("function") ? &(*tc)["function"] : nullptr;
      if (type == nullptr || !type->is_string() || *type != "function" || fn == nullptr ||
          !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
        throw bad("tool_choice",
                  "expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      tool_choice = "function";
      r.forced_tool = (*fn)["name"].get<std::string>();
      if (r.forced_tool->empty()) throw bad("tool_choice", "the function name is empty");
    } else if (!tc->is_string()) {
      throw bad("tool_choice", "expected a string or an object, found " + describe_json_value(*tc));
    } else {
      tool_choice = tc->get<std::string>();
      if (tool_choice != "auto" && tool_choice != "none" && tool_choice != "required") {
        throw bad("tool_choice",
                  "expected \"auto\", \"none\" or \"required\", found \"" + tool_choice + "\"");
      }
      if (tool_choice == "required") r.forced_tool = "";
    }
    if (r.forced_tool && !(r.tools.is_array() && !r.tools.empty())) {
      throw bad("tool_choice", "forcing a tool call needs tools");
    }
  }
  r.wants_tool_calls =
      r.tools.is_array() && !r.tools.empty() && (tool_choice == "auto" || r.forced_tool);
  r.include_reasoning =
      field("include_reasoning", [&] { return f.bool_or("include_reasoning", true); });
  field("parallel_tool_calls", [&] { return f.opt_bool("parallel_tool_calls"); });
  read_structured(doc, body, r);
  if (r.forced_tool && r.grammar) {
    throw bad(r.grammar->field, "cannot be combined with a forced tool_choice");
  }
  if (const json* kw = f.find("chat_template_kwargs"); kw != nullptr && !kw->is_object()) {
    throw bad("chat_template_kwargs", "expected an object, found " + describe_json_value(*kw));
  }
  const bool add_generation_prompt =
      field("add_generation_prompt", [&] { return f.bool_or("add_generation_prompt", true); });
  if (auto lp = field("logprobs", [&] { return f.opt_bool("logprobs"); }); lp && *lp) {
    r.top_logprobs = 0;
  }
  if (auto k =
          field("top_logprobs", [&] { return f.opt_int_in("top_logprobs", 0, kMaxTopLogprobs); })) {
    if (r.top_logprobs < 0) throw bad("top_logprobs", "needs logprobs: true");
    r.top_logprobs = static_cast<int>(*k);
  }

  // The template sees tools and messages in the request's key order (a model's tool prompt
  // prints schemas as given), which nlohmann::json (sorted keys) loses: re-read them in
  // order. The depth-limited parse above already accepted the text.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body);
  nlohmann::ordered_json sub = nlohmann::ordered_json::object();
  sub["messages"] = ordered["messages"];
  arguments_as_objects(sub["messages"]);
  r.media = take_media_parts(sub["messages"]);
  for (const char* key : {"tools", "chat_template_kwargs"}) {
    if (ordered.contains(key) && !ordered[key].is_null()) sub[key] = ordered[key];
  }
  sub["add_generation_prompt"] = add_generation_prompt;
  try {
    r.chat = chat::ChatRequest::from_json(
        sub.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), kSource);
  } catch (const Error& e) {
    throw ApiError(400, e.message(), "messages");
  }
  return r;
}

OpenAiRequest parse_completion_request(std::string_view body) {
  const json doc = parse_body(body);
  const JsonFields f = field("", [&] { return JsonFields(doc, std::string(kSource)); });
  OpenAiRequest r;
  r.kind = ApiKind::kCompletion;
  read_common(f, r);
  read_max_tokens(f, r, /*chat=*/false);

  // prompt: "text", [ids], or a batch of one of those; a batch of several is refused.
  const json* prompt = f.find("prompt");
  if (prompt == nullptr) {
    throw ApiError(400, f.missing("prompt", "a string or a list of token ids").message(), "prompt");
  }
  auto read_ids = [&](const json& list) {
    if (list.empty()) throw bad("prompt", "the list of token ids is empty");
    for (const json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > int64_t{INT32_MAX}) {
        throw bad("prompt", "expected token ids (integers >= 0), found " + describe_json_value(id));
      }
      r.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    r.prompt_is_ids = true;
  };
  if (prompt->is_string()) {
    r.prompt_text = prompt->get<std::string>();
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    read_ids(*prompt);
  } else if (prompt->is_array() && !prompt->empty()) {
    if (prompt->size() > 1) {
      throw unsupported("prompt", "a batch of " + std::to_string(prompt->size()) +
                                      " prompts is not supported: send one request per prompt");
    }
    const json& one = (*prompt)[0];
    if (one.is_string()) {
      r.prompt_text = one.get<std::string>();
    } else if (one.is_array()) {
      read_ids(one);
    } else {
      throw bad("prompt",
                "expected a string or a list of token ids, found " + describe_json_value(one));
    }
  } else {
    throw bad("prompt",
              "expected a string or a list of token ids, found " + describe_json_value(*prompt));
  }

  if (auto lp = field("logprobs", [&] { return f.opt_int_in("logprobs", 0, kMaxTopLogprobs); })) {
    r.top_logprobs = static_cast<int>(*lp);
  }
  if (auto e = field("echo", [&] { return f.opt_bool("echo"); }); e && *e) {
    throw unsupported("echo", "echo is not supported");
  }
  if (auto b = field("best_of", [&] { return f.opt_int("best_of"); }); b && *b != 1) {
    throw unsupported("best_of", "only best_of = 1 is supported");
  }
  if (auto s = field("suffix", [&] { return f.opt_string("suffix"); }); s && !s->empty()) {
    throw unsupported("suffix", "suffix is not supported");
  }
  read_structured(doc, body, r);
  return r;
}

ServeRequest to_serve_request(const OpenAiRequest& req, std::vector<int32_t> prompt,
                              int64_t context_limit, int64_t vocab_size,
                              chat::ToolCallFormat tool_format) {
  const auto n = static_cast<int64_t>(prompt.size());
  const char* where = req.kind == ApiKind::kChat ? "messages" : "prompt";
  if (n == 0) throw ApiError(400, "the prompt encodes to no tokens", where);
  // One token at least must fit after the prompt: its logits give the first sample.
  if (n >= context_limit) {
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(context_limit) +
                       " tokens. However, your prompt has " + std::to_string(n) +
                       " tokens, which leaves no room for a completion.",
                   where, "", "context_length_exceeded");
  }
  ServeRequest s;
  s.max_tokens = context_limit - n;
  if (req.max_tokens) {
    if (*req.max_tokens > s.max_tokens) {
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(context_limit) +
                         " tokens. However, you requested " + std::to_string(n + *req.max_tokens) +
                         " tokens (" + std::to_string(n) + " in the " + where + ", " +
                         std::to_string(*req.max_tokens) +
                         " in the completion). Please reduce the length of the " + where +
                         " or completion.",
                     req.kind == ApiKind::kChat ? "max_completion_tokens" : "max_tokens", "",
                     "context_length_exceeded");
    }
    s.max_tokens = *req.max_tokens;
  }
  s.prompt = std::move(prompt);
  s.sampling = req.sampling;
  // Without a seed every request samples differently, as OpenAI's do.
  s.seed = req.seed ? *req.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  s.stop = req.stop;
  s.ignore_eos = req.ignore_eos;
  s.speculative = req.speculative;
  s.session = req.session;
  // vLLM's tool parsers do the same: a parser whose markers are special tokens must see them.
  s.skip_special_tokens =
      req.skip_special_tokens.value_or(!chat::tool_call_markers_are_special(tool_format));
  s.top_logprobs = req.top_logprobs;
  s.presence_penalty = req.presence_penalty;
  s.frequency_penalty = req.frequency_penalty;
  for (const auto& entry : req.logit_bias) {
    if (entry.first >= vocab_size) {
      throw bad("logit_bias", "token id " + std::to_string(entry.first) +
                                  " is outside the model's vocabulary [0, " +
                                  std::to_string(vocab_size) + ")");
    }
  }
  s.logit_bias = req.logit_bias;
  return s;
}

std::vector<ServeRequest> choice_requests(const OpenAiRequest& req, ServeRequest first) {
  std::vector<ServeRequest> out;
  out.reserve(static_cast<size_t>(req.n));
  for (int i = 1; i < req.n; ++i) {
    ServeRequest c = first;
    c.seed = req.seed ? *req.seed + static_cast<uint64_t>(i)
                      : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    out.push_back(std::move(c));
  }
  out.insert(out.begin(), std::move(first));
  return out;
}

}  // namespace metrale::http
