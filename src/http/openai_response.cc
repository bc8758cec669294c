// The response side of the OpenAI wire format (openai_api.h): the bodies, SSE chunks, logprobs
// and usage in OpenAI's shapes, the reply parser that splits reasoning and tool calls, and the
// /tokenize and /detokenize bodies.
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
using fields::bytes_of;
using fields::field;
using fields::json;
using fields::kSource;
using fields::parse_body;
using fields::token_text;

const char* openai_finish_reason(FinishReason r, bool called_tools) {
  if (r == FinishReason::kLength) return "length";
  return called_tools ? "tool_calls" : "stop";
}

std::string new_tool_call_id(chat::ToolCallFormat format) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{(uint64_t{std::random_device{}()} << 32) ^
                                   std::random_device{}()};
  const bool mistral = format == chat::ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlnum) - 2);
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlnum[pick(rng)];
  return id;
}

nlohmann::json tool_call_json(const chat::ToolCall& call, chat::ToolCallFormat format,
                              int64_t index) {
  json j = json::object();
  if (index >= 0) j["index"] = index;
  j["id"] = call.id.empty() ? new_tool_call_id(format) : call.id;
  j["type"] = "function";
  j["function"] = {{"name", call.name}, {"arguments", call.arguments}};
  return j;
}

nlohmann::json usage_json(const ServeUsage& u) {
  json j{{"prompt_tokens", u.prompt_tokens},
         {"completion_tokens", u.completion_tokens},
         {"total_tokens", u.prompt_tokens + u.completion_tokens},
         {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  // A speculative request's drafts as OpenAI's predicted-output counts: the draft tokens the
  // model verified and accepted, and those it rejected (none of which are billed apart: the
  // completion tokens are what was generated).
  if (u.speculative) {
    j["completion_tokens_details"] = {
        {"accepted_prediction_tokens", u.accepted_draft_tokens},
        {"rejected_prediction_tokens", u.draft_tokens - u.accepted_draft_tokens}};
  }
  return j;
}

namespace {

// -inf (a token top-k / top-p removed cannot be sampled, but may be listed) is not JSON;
// vLLM clamps the same way.
double finite_logprob(float lp) { return std::max(static_cast<double>(lp), -9999.0); }

}  // namespace

nlohmann::json chat_logprobs_json(const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string text = token_text(tok, lp.id);
    json top = json::array();
    for (const auto& [id, logprob] : lp.top) {
      const std::string t = token_text(tok, id);
      top.push_back({{"token", t}, {"logprob", finite_logprob(logprob)}, {"bytes", bytes_of(t)}});
    }
    content.push_back({{"token", text},
                       {"logprob", finite_logprob(lp.logprob)},
                       {"bytes", bytes_of(text)},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}};
}

nlohmann::json completion_logprobs_json(const std::vector<TokenLogprob>& lps, const Tokenizer& tok,
                                        int64_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string text = token_text(tok, lp.id);
    tokens.push_back(text);
    token_logprobs.push_back(finite_logprob(lp.logprob));
    json alts = json::object();
    for (const auto& [id, logprob] : lp.top) alts[token_text(tok, id)] = finite_logprob(logprob);
    top.push_back(std::move(alts));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(text.size());
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top)},
              {"text_offset", std::move(offsets)}};
}

ReplyParser::ReplyParser(ReplyFormat format)
    : format_(std::move(format)), reasoning_(format_.reasoning, format_.reasoning_starts_open) {
  if (format_.tool_calls != chat::ToolCallFormat::kNone) {
    tool_calls_.emplace(format_.tool_calls, format_.tools);
  }
}

ReplyDelta ReplyParser::feed(std::string_view text) {
  chat::ReasoningDelta r = reasoning_.feed(text);
  ReplyDelta out;
  if (format_.include_reasoning) out.reasoning = std::move(r.reasoning);
  if (!tool_calls_) {
    out.content = std::move(r.content);
    return out;
  }
  chat::ToolCallDelta t = tool_calls_->feed(r.content);
  out.content = std::move(t.content);
  out.calls = std::move(t.calls);
  return out;
}

void ReplyDelta::append(ReplyDelta later) {
  reasoning += later.reasoning;
  content += later.content;
  for (chat::ToolCall& call : later.calls) calls.push_back(std::move(call));
}

ReplyDelta ReplyParser::finish() {
  ReplyDelta out;
  chat::ReasoningDelta r = reasoning_.finish();
  if (format_.include_reasoning) out.reasoning = std::move(r.reasoning);
  if (!tool_calls_) {
    out.content = std::move(r.content);
    return out;
  }
  for (chat::ToolCallDelta t : {tool_calls_->feed(r.content), tool_calls_->finish()}) {
    out.append({.content = std::move(t.content), .calls = std::move(t.calls)});
  }
  return out;
}

ReplyDelta ReplyParser::parse(const ReplyFormat& format, std::string_view text) {
  ReplyParser parser(format);
  ReplyDelta out = parser.feed(text);
  out.append(parser.finish());
  return out;
}

void Collected::add(ServeEvent& e) {
  text += e.text;
  for (TokenLogprob& lp : e.logprobs) logprobs.push_back(std::move(lp));
  if (e.done) {
    done = true;
    finish = e.finish;
    error = e.error;
    usage = e.usage;
  }
}

ServeUsage combined_usage(std::span<const ServeUsage> choices) {
  ServeUsage u;
  if (choices.empty()) return u;
  u.prompt_tokens = choices[0].prompt_tokens;
  u.cached_tokens = choices[0].cached_tokens;
  for (const ServeUsage& c : choices) {
    u.completion_tokens += c.completion_tokens;
    u.speculative = u.speculative || c.speculative;
    u.draft_tokens += c.draft_tokens;
    u.accepted_draft_tokens += c.accepted_draft_tokens;
  }
  return u;
}

namespace {

ServeUsage usage_of(std::span<const Collected> choices) {
  std::vector<ServeUsage> u;
  for (const Collected& c : choices) u.push_back(c.usage);
  return combined_usage(u);
}

json chat_choice_json(int index, const Collected& c, bool logprobs, const Tokenizer& tok,
                      const ReplyFormat& reply) {
  const ReplyDelta parsed = ReplyParser::parse(reply, c.text);

  const bool called_tools = !parsed.calls.empty();
  json message = {{"role", "assistant"}};
  message["content"] =
      called_tools && parsed.content.empty() ? json(nullptr) : json(parsed.content);
  if (!parsed.reasoning.empty()) message["reasoning_content"] = parsed.reasoning;
  if (called_tools) {
    json calls = json::array();
    for (const chat::ToolCall& call : parsed.calls) {
      calls.push_back(tool_call_json(call, reply.tool_calls));
    }
    message["tool_calls"] = std::move(calls);
  }
  return json{{"index", index},
              {"message", std::move(message)},
              {"logprobs", logprobs ? chat_logprobs_json(c.logprobs, tok) : json(nullptr)},
              {"finish_reason", openai_finish_reason(c.finish, called_tools)}};
}

}  // namespace

nlohmann::json chat_completion_json(const ResponseMeta& meta, std::span<const Collected> choices,
                                    bool logprobs, const Tokenizer& tok, const ReplyFormat& reply) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    out.push_back(chat_choice_json(static_cast<int>(i), choices[i], logprobs, tok, reply));
  }
  return json{{"id", meta.id},
              {"object", "chat.completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", std::move(out)},
              {"usage", usage_json(usage_of(choices))}};
}

nlohmann::json text_completion_json(const ResponseMeta& meta, std::span<const Collected> choices,
                                    bool logprobs, const Tokenizer& tok) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Collected& c = choices[i];
    out.push_back(
        {{"index", static_cast<int>(i)},
         {"text", c.text},
         {"logprobs", logprobs ? completion_logprobs_json(c.logprobs, tok, 0) : json(nullptr)},
         {"finish_reason", openai_finish_reason(c.finish)}});
  }
  return json{{"id", meta.id},
              {"object", "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", std::move(out)},
              {"usage", usage_json(usage_of(choices))}};
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_frame(const nlohmann::json& j) { return "data: " + dump_json(j) + "\n\n"; }

SseEncoder::SseEncoder(ApiKind kind, ResponseMeta meta, bool logprobs, bool include_usage,
                       const Tokenizer& tok, const ReplyFormat& reply, int n_choices)
    : kind_(kind),
      meta_(std::move(meta)),
      logprobs_(logprobs),
      include_usage_(include_usage),
      tok_(&tok),
      open_choices_(n_choices),
      usage_(static_cast<size_t>(std::max(n_choices, 0))) {
  METRALE_CHECK(kind_ == ApiKind::kChat || (reply.reasoning == chat::ReasoningFormat::kNone &&
                                            reply.tool_calls == chat::ToolCallFormat::kNone),
                "reasoning and tool calls are parsed in chats only");
  METRALE_CHECK(n_choices >= 1, "SseEncoder: n_choices must be >= 1, found ", n_choices);
  choices_.reserve(static_cast<size_t>(n_choices));
  for (int i = 0; i < n_choices; ++i) choices_.emplace_back(reply);
}

std::string SseEncoder::delta_frames(int index, const ReplyDelta& d, nlohmann::json logprobs) {
  std::string out;
  Choice& c = choices_[static_cast<size_t>(index)];
  if (!d.reasoning.empty()) {
    out += sse_frame(chunk({{"index", index},
                            {"delta", {{"reasoning_content", d.reasoning}}},
                            {"logprobs", nullptr},
                            {"finish_reason", nullptr}}));
  }
  if (!d.content.empty() || !logprobs.is_null()) {
    out += sse_frame(chunk({{"index", index},
                            {"delta", {{"content", d.content}}},
                            {"logprobs", std::move(logprobs)},
                            {"finish_reason", nullptr}}));
  }
  for (const chat::ToolCall& call : d.calls) {
    const chat::ToolCallFormat format = c.reply.format().tool_calls;
    out += sse_frame(
        chunk({{"index", index},
               {"delta",
                {{"tool_calls", json::array({tool_call_json(call, format, c.tool_calls_sent++)})}}},
               {"logprobs", nullptr},
               {"finish_reason", nullptr}}));
  }
  return out;
}

nlohmann::json SseEncoder::chunk(nlohmann::json choice) const {
  json c = {{"id", meta_.id},
            {"object", kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", json::array()}};
  if (!choice.is_null()) c["choices"].push_back(std::move(choice));
  return c;
}

std::string SseEncoder::encode(const ServeEvent& e, int index) {
  METRALE_CHECK(index >= 0 && index < static_cast<int>(choices_.size()), "SseEncoder: choice ",
                index, " of ", choices_.size());
  Choice& c = choices_[static_cast<size_t>(index)];
  if (finished_ || c.finished) return "";
  std::string out;
  const bool is_chat = kind_ == ApiKind::kChat;
  if (!c.started) {
    c.started = true;
    if (is_chat) {
      out += sse_frame(chunk({{"index", index},
                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr}}));
    }
  }
  if (!e.text.empty() || (logprobs_ && !e.logprobs.empty())) {
    json lp = nullptr;
    if (logprobs_) {
      lp = is_chat ? chat_logprobs_json(e.logprobs, *tok_)
                   : completion_logprobs_json(e.logprobs, *tok_, c.text_offset);
    }
    c.text_offset += static_cast<int64_t>(e.text.size());
    if (is_chat) {
      out += delta_frames(index, c.reply.feed(e.text), std::move(lp));
    } else {
      out += sse_frame(chunk({{"index", index},
                              {"text", e.text},
                              {"logprobs", std::move(lp)},
                              {"finish_reason", nullptr}}));
    }
  }
  if (!e.done) return out;
  c.finished = true;
  if (e.finish == FinishReason::kError || e.finish == FinishReason::kTimeout) {
    // Any choice failing ends the whole stream.
    const bool timeout = e.finish == FinishReason::kTimeout;
    out += sse_frame(ApiError(timeout ? 503 : 500,
                              timeout ? "the request timed out" : "generation failed: " + e.error,
                              "", "", timeout ? "timeout" : "")
                         .to_json());
  } else if (e.finish != FinishReason::kCancelled) {  // a cancelled stream has no reader
    // Whatever the parser still holds (a possible marker, an unterminated call) is resolved.
    if (is_chat) out += delta_frames(index, c.reply.finish(), nullptr);
    json choice = {{"index", index},
                   {"logprobs", nullptr},
                   {"finish_reason", openai_finish_reason(e.finish, c.tool_calls_sent > 0)}};
    if (is_chat) {
      choice["delta"] = json::object();
    } else {
      choice["text"] = "";
    }
    out += sse_frame(chunk(std::move(choice)));
    usage_[static_cast<size_t>(index)] = e.usage;
    if (--open_choices_ > 0) return out;  // the others are still running
    if (include_usage_) {
      json u = chunk(nullptr);
      u["usage"] = usage_json(combined_usage(usage_));
      out += sse_frame(u);
    }
  }
  finished_ = true;
  out += "data: [DONE]\n\n";
  return out;
}

std::string SseEncoder::fail(int status, std::string_view message, std::string_view code) {
  if (finished_) return "";
  finished_ = true;
  return sse_frame(ApiError(status, std::string(message), "", "", std::string(code)).to_json()) +
         "data: [DONE]\n\n";
}

nlohmann::json generate_request_json(const ServeRequest& s, int n, std::string_view request_id,
                                     std::string_view model) {
  json sampling{{"n", n},
                {"max_tokens", s.max_tokens},
                {"temperature", s.sampling.temperature},
                {"top_p", s.sampling.top_p},
                {"top_k", s.sampling.top_k},
                {"min_p", s.sampling.min_p},
                {"repetition_penalty", s.sampling.repetition_penalty},
                {"presence_penalty", s.presence_penalty},
                {"frequency_penalty", s.frequency_penalty},
                {"seed", s.seed},
                {"stop", s.stop},
                {"ignore_eos", s.ignore_eos},
                {"skip_special_tokens", s.skip_special_tokens},
                {"logprobs", s.top_logprobs >= 0 ? json(s.top_logprobs) : json(nullptr)}};
  if (!s.logit_bias.empty()) {
    json bias = json::object();
    for (const auto& [id, b] : s.logit_bias) bias[std::to_string(id)] = b;
    sampling["logit_bias"] = std::move(bias);
  }
  return json{{"request_id", request_id},
              {"token_ids", s.prompt},
              {"sampling_params", std::move(sampling)},
              {"model", model},
              {"stream", false}};
}

std::string tokenize_response(std::string_view body, const Tokenizer& tok) {
  const json doc = parse_body(body);
  const JsonFields f = field("", [&] { return JsonFields(doc, std::string(kSource)); });
  const std::string content = field("content", [&] { return f.req_string("content"); });
  const bool add_special = field("add_special", [&] { return f.bool_or("add_special", false); });
  const bool with_pieces = field("with_pieces", [&] { return f.bool_or("with_pieces", false); });
  const std::vector<int32_t> ids = tok.encode(content, add_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string piece = token_text(tok, id);
    // llama-server: the piece as a string when it is valid UTF-8, else its bytes.
    if (metrale::tok::utf8_valid_prefix(piece) == piece.size()) {
      tokens.push_back({{"id", id}, {"piece", piece}});
    } else {
      tokens.push_back({{"id", id}, {"piece", bytes_of(piece)}});
    }
  }
  return dump_json(json{{"tokens", std::move(tokens)}});
}

std::string detokenize_response(std::string_view body, const Tokenizer& tok) {
  const json doc = parse_body(body);
  const JsonFields f = field("", [&] { return JsonFields(doc, std::string(kSource)); });
  const std::vector<int64_t> ids64 =
      field("tokens", [&] { return f.opt_int_list("tokens", 0); }).value_or(std::vector<int64_t>{});
  std::vector<int32_t> ids;
  for (int64_t id : ids64) {
    if (id > INT32_MAX) throw bad("tokens", "token id " + std::to_string(id) + " is out of range");
    ids.push_back(static_cast<int32_t>(id));
  }
  // decode() names an id outside the vocabulary.
  const std::string text = field("tokens", [&] { return tok.decode(ids, false); });
  return dump_json(json{{"content", text}});
}

}  // namespace metrale::http
