#pragma once
// The OpenAI API's wire format, without any HTTP: request bodies of POST /v1/chat/completions
// and /v1/completions parsed and strictly validated into an OpenAiRequest (then a
// ServeRequest), and the response bodies built in OpenAI's shapes (chat.completion,
// chat.completion.chunk, text_completion, their logprobs and usage, errors). Requests are
// read in openai_request.cc, responses written in openai_response.cc.
//
// Validation follows OpenAI's reference server: unknown fields are ignored (clients send
// vendor extensions), but a KNOWN field of the wrong type or out of range is a 400 naming the
// field (`param`), and parameters we do not implement with a non-default value (echo,
// best_of, several prompts) are a 400 saying so rather than
// being silently ignored. null is the same as absent, as in the OpenAI SDKs.
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "core/error.h"
#include "grammar/grammar.h"
#include "http/media_parts.h"
#include "serve/scheduler.h"

namespace metrale {
class Tokenizer;
}

namespace metrale::http {

// Limits on what a request may ask for (a sane cap, not a model property).
inline constexpr int64_t kMaxTokensCap = int64_t{1} << 20;
inline constexpr size_t kMaxStopStrings = 16;  // OpenAI allows 4; vLLM any number
inline constexpr size_t kMaxStopBytes = 1024;  // per stop string
inline constexpr int kMaxTopLogprobs = 20;     // OpenAI's chat limit
inline constexpr int kMaxChoices = 16;         // n: each choice is a stream of its own

// An error for the client, in OpenAI's shape {"error": {message, type, param, code}}.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string type = "",
           std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }
  nlohmann::json to_json() const;

 private:
  int status_;
  std::string param_, type_, code_;
};

// The OpenAI error type of an HTTP status: 400 invalid_request_error, 401
// authentication_error, 404 not_found_error, 413 invalid_request_error, 429
// rate_limit_error, 5xx server_error.
std::string error_type_for_status(int status);
// {"error": {...}} as text.
std::string error_body(int status, std::string_view message, std::string_view param = "",
                       std::string_view code = "");

enum class ApiKind : uint8_t { kChat, kCompletion };

struct OpenAiRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;  // as the client named it ("" when absent); echoed in responses

  // kChat: what the chat template renders (messages, tools, chat_template_kwargs,
  // add_generation_prompt: default true here, as vLLM and llama-server default it). An
  // assistant message's tool_calls[].function.arguments given as JSON text (as OpenAI's API
  // has them) reach the template as the object they hold, as vLLM passes them: templates
  // iterate them (`arguments|items`).
  chat::ChatRequest chat;
  // kChat with tools: the tools as sent (they type the arguments the XML-like formats parse),
  // and whether the reply is parsed for tool calls (tools given, tool_choice not "none"; the
  // server's parser decides the format). tool_choice "required" or a named function would
  // need constrained decoding: refused.
  nlohmann::json tools;
  bool wants_tool_calls = false;
  bool include_reasoning = true;  // vLLM's: false drops reasoning_content from the reply
  // kChat: the image_url / video_url parts in order (http/media_parts.h); in `chat` each is
  // now {"type": "image"} / {"type": "video"}, which templates render as placeholders.
  std::vector<MediaPart> media;
  // kCompletion: the prompt, text or token ids (prompt_is_ids).
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;

  std::optional<int64_t> max_tokens;             // none: what the context leaves
  SamplingParams sampling{.temperature = 1.0f};  // OpenAI's default temperature is 1
  std::optional<uint64_t> seed;
  // n choices: n streams over the same prompt, choice i sampling with seed + i (with a seed;
  // so choice i equals the same request with n = 1 and that seed).
  int n = 1;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // vLLM's extension
  // metrale's extension: false decodes this request without speculative drafts (the output
  // is the same; only the speed differs). Default true: the server's --speculative applies.
  bool speculative = true;
  // SGLang's session_id: the conversation this request continues ("": none). With
  // `--speculative mtp` the session's next request adopts this one's drafter rows (MTP carry).
  std::string session;
  std::optional<bool> skip_special_tokens;  // vLLM's extension (default true)
  int top_logprobs = -1;                    // -1: no logprobs
  float presence_penalty = 0.0f;            // [-2, 2]
  float frequency_penalty = 0.0f;           // [-2, 2]
  // Structured outputs: at most one of response_format (json_object / json_schema), vLLM's
  // structured_outputs {json, regex, choice, grammar, json_object} and its older guided_json,
  // guided_regex, guided_choice, guided_grammar. Schemas keep the request's key order.
  std::optional<GrammarSpec> grammar;
  // kChat: tool_choice "required" ("") or a named function (its name): the reply is one call
  // in the template's tool-call format, its arguments matching the tool's parameters.
  std::optional<std::string> forced_tool;
  // logit_bias {"<token id>": bias in [-100, 100]}, at most kMaxLogitBias entries, sorted by
  // id (to_serve_request checks the ids against the vocabulary).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// The grammar of a forced tool call (tool_choice "required" when `name` is empty: one call of
// any of the tools; else the named function) in `format` (every format but kNone), each tool's
// "parameters" the schema of its arguments (forced_tool_call.cc). ApiError 400 naming
// tool_choice for a name not among the tools or a schema the format cannot force.
struct ForcedCallOptions {
  // How the template spells a call of the format.
  chat::ToolCallSpelling spelling = chat::ToolCallSpelling::kDefault;
  // The prompt leaves the reply inside a <think> block (ReplyFormat's reasoning_starts_open):
  // the reasoning up to </think> is free, the call follows it.
  bool reasoning_open = false;
};
GrammarSpec forced_tool_call_grammar(const nlohmann::json& tools, const std::string& name,
                                     chat::ToolCallFormat format,
                                     const ForcedCallOptions& options = {});

// Parse and validate a request body (ApiError 400 on any problem).
OpenAiRequest parse_chat_request(std::string_view body);
OpenAiRequest parse_completion_request(std::string_view body);

// The ServeRequest for `req` over `prompt` (already rendered and tokenized), for a model of
// `vocab_size` token ids (a logit_bias id outside it is a 400 naming logit_bias). Special tokens
// are kept in the text when the request asks, or when `tool_format` (the parser the reply
// goes through, kNone for none) has special-token markers. max_tokens
// defaults to what the context leaves; a prompt or max_tokens that cannot fit the context is
// an ApiError 400 with OpenAI's "maximum context length" message. No seed: a fresh random one
// (only sampling uses it).
ServeRequest to_serve_request(const OpenAiRequest& req, std::vector<int32_t> prompt,
                              int64_t context_limit, int64_t vocab_size,
                              chat::ToolCallFormat tool_format = chat::ToolCallFormat::kNone);

// The ServeRequests of `req`'s n choices from the first one (to_serve_request's): choice i
// samples with seed + i when the request has a seed, else with a fresh random seed.
std::vector<ServeRequest> choice_requests(const OpenAiRequest& req, ServeRequest first);

// What every response object of one request repeats.
struct ResponseMeta {
  std::string id;       // chatcmpl-N / cmpl-N
  int64_t created = 0;  // unix seconds
  std::string model;
};

// OpenAI's names for a finish: "stop", "length", and "tool_calls" for a stop after the model
// called tools; others (cancelled, timeout, error) never reach a client as a finish_reason.
const char* openai_finish_reason(FinishReason r, bool called_tools = false);

// A fresh id for a tool call the model made: "call_" + 24 random letters and digits, or for
// Mistral's format 9 of them (its chat templates refuse any other length on the next turn).
std::string new_tool_call_id(chat::ToolCallFormat format);
// {"id", "type": "function", "function": {"name", "arguments"}}, with "index" when >= 0
// (streamed deltas). The model's own id (Mistral's [CALL_ID]) is kept; else a fresh one.
nlohmann::json tool_call_json(const chat::ToolCall& call, chat::ToolCallFormat format,
                              int64_t index = -1);

nlohmann::json usage_json(const ServeUsage& usage);

// Logprobs in each API's format. `tok` decodes ids to token text and bytes.
// chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
nlohmann::json chat_logprobs_json(const std::vector<TokenLogprob>& lps, const Tokenizer& tok);
// completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset};
// `text_offset` is where the first of these tokens starts in the completion text.
nlohmann::json completion_logprobs_json(const std::vector<TokenLogprob>& lps, const Tokenizer& tok,
                                        int64_t text_offset);

// How a chat reply is split: first its reasoning (chat/reasoning.h), then tool calls in what
// is left (chat/tool_calls.h); the rest is content. The default splits nothing.
struct ReplyFormat {
  chat::ReasoningFormat reasoning = chat::ReasoningFormat::kNone;
  bool reasoning_starts_open = false;  // the rendered prompt left a <think> block open
  bool include_reasoning = true;       // false: reasoning is parsed out and dropped
  chat::ToolCallFormat tool_calls = chat::ToolCallFormat::kNone;  // kNone: no tool parsing
  nlohmann::json tools;  // the request's tools (they type XML-like formats' arguments)
};

struct ReplyDelta {
  std::string reasoning;
  std::string content;
  std::vector<chat::ToolCall> calls;
  void append(ReplyDelta later);  // `later` follows this delta in the reply
};

// ReplyFormat's split, incrementally (any split of the text gives what one parse gives).
class ReplyParser {
 public:
  explicit ReplyParser(ReplyFormat format);
  ReplyDelta feed(std::string_view text);
  ReplyDelta finish();
  const ReplyFormat& format() const { return format_; }
  // A whole reply at once (feed + finish).
  static ReplyDelta parse(const ReplyFormat& format, std::string_view text);

 private:
  ReplyFormat format_;
  chat::ReasoningParser reasoning_;
  std::optional<chat::ToolCallParser> tool_calls_;
};

// Accumulates a stream's events into the one non-streaming response.
struct Collected {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::kStop;
  std::string error;
  ServeUsage usage;
  bool done = false;
  void add(ServeEvent& e);
};

// Usage over a request's choices: the prompt (and what the prefix cache gave it) once, the
// completion tokens of every choice.
ServeUsage combined_usage(std::span<const ServeUsage> choices);

// A complete chat.completion / text_completion object, choices in order (index i). The chat
// text is split by `reply`:
// message.reasoning_content (when there is reasoning), message.content (null when tool calls
// leave none), message.tool_calls (when there are calls), and finish_reason "tool_calls" when
// there are calls and the model stopped by itself.
nlohmann::json chat_completion_json(const ResponseMeta& meta, std::span<const Collected> choices,
                                    bool logprobs, const Tokenizer& tok,
                                    const ReplyFormat& reply = {});
nlohmann::json text_completion_json(const ResponseMeta& meta, std::span<const Collected> choices,
                                    bool logprobs, const Tokenizer& tok);
// One choice.
inline nlohmann::json chat_completion_json(const ResponseMeta& meta, const Collected& c,
                                           bool logprobs, const Tokenizer& tok,
                                           const ReplyFormat& reply = {}) {
  return chat_completion_json(meta, std::span(&c, 1), logprobs, tok, reply);
}
inline nlohmann::json text_completion_json(const ResponseMeta& meta, const Collected& c,
                                           bool logprobs, const Tokenizer& tok) {
  return text_completion_json(meta, std::span(&c, 1), logprobs, tok);
}

// Streaming: turns a stream's events into SSE frames ("data: {...}\n\n"), in OpenAI's order:
// chat: a first chunk with delta {role: assistant, content: ""}, then one chunk per event with
// text (or logprobs), a last chunk with an empty delta and the finish_reason, the usage chunk
// (choices: []) when include_usage, then "data: [DONE]". Completions: the same without the
// role chunk. An engine error or a timeout ends the stream with an error frame (what vLLM
// sends: {"error": {...}}; the OpenAI SDK raises it) and [DONE]. Chat text goes through a
// ReplyParser: reasoning deltas {reasoning_content}, content deltas, and each tool call as
// one delta {tool_calls: [{index, id, type, function: {name, arguments}}]} once the model has
// written all of it; the finish is "tool_calls" when there were calls.
// With n choices, each choice's chunks carry its index and its own final chunk; the usage
// chunk (over every choice) and [DONE] follow the last. An error in any choice ends the
// stream.
class SseEncoder {
 public:
  SseEncoder(ApiKind kind, ResponseMeta meta, bool logprobs, bool include_usage,
             const Tokenizer& tok, const ReplyFormat& reply = {}, int n_choices = 1);
  // The frames for one event of choice `choice` ("" when it carries nothing to send).
  std::string encode(const ServeEvent& e, int choice = 0);
  // Ends the stream early with an error frame ({"error": {...}} with `status`'s type and
  // `code`) and [DONE]; "" when it has finished already.
  std::string fail(int status, std::string_view message, std::string_view code);
  bool finished() const { return finished_; }

 private:
  struct Choice {
    explicit Choice(const ReplyFormat& format) : reply(format) {}
    bool started = false, finished = false;
    int64_t text_offset = 0;  // completions' logprobs.text_offset
    ReplyParser reply;
    int64_t tool_calls_sent = 0;
  };
  nlohmann::json chunk(nlohmann::json choice) const;
  // A chat's delta chunks: reasoning, content (when non-empty or with logprobs), then calls.
  std::string delta_frames(int index, const ReplyDelta& d, nlohmann::json logprobs);

  ApiKind kind_;
  ResponseMeta meta_;
  bool logprobs_, include_usage_;
  const Tokenizer* tok_;
  std::vector<Choice> choices_;
  int open_choices_;
  std::vector<ServeUsage> usage_;  // each choice's, once it finished
  bool finished_ = false;
};

// "data: <json>\n\n". JSON is dumped with invalid UTF-8 replaced (a token's text may be a
// partial character), never throwing.
std::string sse_frame(const nlohmann::json& j);
std::string dump_json(const nlohmann::json& j);

// vLLM's Renderer API: POST /v1/chat/completions/render answers one GenerateRequest,
// /v1/completions/render a list of one: the request rendered and tokenized exactly as the
// generation endpoint would (`s.prompt`, media placeholders expanded), with the sampling
// parameters it resolved, under vLLM's field names. Routers read `token_ids` to place a request
// by its prefix (vllm-router's cache_aware policy asks a worker to render every request; llm-d's
// precise prefix scorer does too). `n`: the request's choices.
nlohmann::json generate_request_json(const ServeRequest& s, int n, std::string_view request_id,
                                     std::string_view model);

// /tokenize {"content": str, "add_special": bool = false, "with_pieces": bool = false}
// -> {"tokens": [ids]} or {"tokens": [{"id", "piece"}]} (piece: a string, or the list of its
// bytes when they are not valid UTF-8), as llama-server has it.
std::string tokenize_response(std::string_view body, const Tokenizer& tok);
// /detokenize {"tokens": [ids]} -> {"content": text}.
std::string detokenize_response(std::string_view body, const Tokenizer& tok);

}  // namespace metrale::http
