// The OpenAI request parser (every class of bad input is a 400 naming the field) and the
// response shapes (chat.completion, text_completion, their SSE chunks, logprobs, usage).
#include "http/openai_api.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <string>

#include "io/tokenizer/tokenizer.h"

namespace metrale::http {
namespace {

using nlohmann::json;

const Tokenizer& demo_tokenizer() {
  static const Tokenizer tok = Tokenizer::from_file("models/demo/tokenizer.json");
  return tok;
}

// The ApiError a body raises (status 0 when it parses).
ApiError chat_error(const std::string& body) {
  try {
    parse_chat_request(body);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "parsed");
}
ApiError completion_error(const std::string& body) {
  try {
    parse_completion_request(body);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "parsed");
}

const std::string kMsgs = R"("messages": [{"role": "user", "content": "hi"}])";
std::string chat_with(const std::string& extra) { return "{" + kMsgs + ", " + extra + "}"; }
constexpr int64_t kVocab = 1000;  // the vocabulary to_serve_request checks logit_bias ids against

std::string completion_with(const std::string& extra) {
  return R"({"prompt": "And God said", )" + extra + "}";
}

TEST(OpenAiParse, MalformedJsonIs400) {
  for (const std::string body : {"", "{", "{\"messages\": [}", "[1, 2", "nul", "{\"a\": 1,}"}) {
    const ApiError e = chat_error(body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.code(), "invalid_json") << body;
  }
  // Deep nesting is refused by the parser, not by the stack.
  const std::string deep = "{\"messages\": " + std::string(100000, '[') + "}";
  EXPECT_EQ(chat_error(deep).status(), 400);
  // Invalid UTF-8 inside a string.
  EXPECT_EQ(completion_error("{\"prompt\": \"\xff\xfe\"}").status(), 400);
}

TEST(OpenAiParse, TopLevelMustBeAnObject) {
  for (const std::string body : {"[]", "3", "\"x\"", "null"}) {
    EXPECT_EQ(chat_error(body).status(), 400) << body;
    EXPECT_EQ(completion_error(body).status(), 400) << body;
  }
}

TEST(OpenAiParse, KnownFieldsOfTheWrongTypeAre400NamingTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("temperature": "hot")", "temperature"},
      {R"("temperature": 2.5)", "temperature"},
      {R"("temperature": -0.1)", "temperature"},
      {R"("top_p": 0)", "top_p"},
      {R"("top_p": 1.5)", "top_p"},
      {R"("top_k": -2)", "top_k"},
      {R"("top_k": 1.5)", "top_k"},
      {R"("min_p": 2)", "min_p"},
      {R"("seed": "x")", "seed"},
      {R"("seed": 1.5)", "seed"},
      {R"("max_tokens": 0)", "max_tokens"},
      {R"("max_tokens": -5)", "max_tokens"},
      {R"("max_tokens": 3.5)", "max_tokens"},
      {R"("max_tokens": "8")", "max_tokens"},
      {R"("max_tokens": 1000000000000)", "max_tokens"},
      {R"("stream": "yes")", "stream"},
      {R"("stream": 1)", "stream"},
      {R"("stop": 5)", "stop"},
      {R"("stop": ["a", 3])", "stop"},
      {R"("stop": [""])", "stop"},
      {R"("stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])", "stop"},
      {R"("stream_options": {"include_usage": true})", "stream_options"},
      {R"("stream": true, "stream_options": {"include_usage": "yes"})", "stream_options"},
      {R"("stream": true, "stream_options": 3)", "stream_options"},
      {R"("logit_bias": [1])", "logit_bias"},
      {R"("user": 5)", "user"},
      {R"("presence_penalty": "x")", "presence_penalty"},
      {R"("frequency_penalty": 3)", "frequency_penalty"},
      {R"("n": "1")", "n"},
      {R"("model": 3)", "model"},
      {R"("ignore_eos": "no")", "ignore_eos"},
      {R"("speculative": 1)", "speculative"},
  };
  for (const auto& [extra, param] : cases) {
    const ApiError c = chat_error(chat_with(extra));
    EXPECT_EQ(c.status(), 400) << extra;
    EXPECT_EQ(c.param(), param) << extra << ": " << c.what();
    EXPECT_EQ(c.type(), "invalid_request_error") << extra;
    const ApiError p = completion_error(completion_with(extra));
    EXPECT_EQ(p.status(), 400) << extra;
    EXPECT_EQ(p.param(), param) << extra << ": " << p.what();
  }
}

TEST(OpenAiParse, ChatSpecificBadInput) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({})", "messages"},  // missing
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [3]})", "messages"},
      {R"({"messages": [{"content": "no role"}]})", "messages"},
      {R"({"messages": [{"role": 1, "content": "x"}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": 7}]})", "messages"},
      {chat_with(R"("tools": "x")"), "tools"},
      {chat_with(R"("tool_choice": 5)"), "tool_choice"},
      {chat_with(R"("parallel_tool_calls": "y")"), "parallel_tool_calls"},
      {chat_with(R"("response_format": {"type": "json_schema"})"), "response_format.json_schema"},
      {chat_with(R"("response_format": {"type": "yaml"})"), "response_format"},
      {chat_with(R"("response_format": "text")"), "response_format"},
      {chat_with(R"("chat_template_kwargs": [1])"), "chat_template_kwargs"},
      {chat_with(R"("add_generation_prompt": 1)"), "add_generation_prompt"},
      {chat_with(R"("logprobs": 3)"), "logprobs"},
      {chat_with(R"("top_logprobs": 2)"), "top_logprobs"},  // needs logprobs: true
      {chat_with(R"("logprobs": true, "top_logprobs": 21)"), "top_logprobs"},
      {chat_with(R"("logprobs": true, "top_logprobs": -1)"), "top_logprobs"},
      {chat_with(R"("max_completion_tokens": 0)"), "max_completion_tokens"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = chat_error(body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.param(), param) << body << ": " << e.what();
  }
  // A missing field says so.
  EXPECT_NE(std::string(chat_error("{}").what()).find("messages"), std::string::npos);
}

TEST(OpenAiParse, CompletionSpecificBadInput) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": null})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [-1]})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": [1.5]})", "prompt"},
      {R"({"prompt": [3000000000]})", "prompt"},
      {R"({"prompt": [{"a": 1}]})", "prompt"},
      {R"({"prompt": [[]]})", "prompt"},
      {completion_with(R"("logprobs": true)"), "logprobs"},
      {completion_with(R"("logprobs": 21)"), "logprobs"},
      {completion_with(R"("echo": "x")"), "echo"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.param(), param) << body << ": " << e.what();
  }
}

TEST(OpenAiParse, UnsupportedParametersAreRefusedNotIgnored) {
  for (const std::string& body :
       {std::string(R"({"prompt": ["a", "b"]})"), std::string(R"({"prompt": [[1], [2]]})"),
        completion_with(R"("echo": true)"), completion_with(R"("best_of": 2)"),
        completion_with(R"("suffix": "end")")}) {
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.code(), "unsupported_parameter") << body;
  }
  // Their neutral values are fine.
  EXPECT_EQ(chat_error(chat_with(R"("n": 1, "logit_bias": {}, "echo": false)")).status(), 0);
}

TEST(OpenAiParse, LogitBiasMapsToSortedEntries) {
  const std::string extra = R"("logit_bias": {"50": -100, "7": 100, "0": 2.5, "123": 0})";
  const std::vector<std::pair<int32_t, float>> want = {
      {0, 2.5f}, {7, 100.0f}, {50, -100.0f}, {123, 0.0f}};
  EXPECT_EQ(parse_chat_request(chat_with(extra)).logit_bias, want);
  const OpenAiRequest c = parse_completion_request(completion_with(extra));
  EXPECT_EQ(c.logit_bias, want);
  EXPECT_EQ(to_serve_request(c, {1, 2}, 100, kVocab).logit_bias, want);
  // null and {} are no bias.
  EXPECT_TRUE(parse_chat_request(chat_with(R"("logit_bias": null)")).logit_bias.empty());
  EXPECT_TRUE(parse_completion_request(completion_with(R"("logit_bias": {})")).logit_bias.empty());
  // 1024 entries are allowed.
  std::string many = R"("logit_bias": {)";
  for (int i = 0; i < 1024; ++i) many += (i ? ", \"" : "\"") + std::to_string(i) + "\": 1";
  EXPECT_EQ(parse_chat_request(chat_with(many + "}")).logit_bias.size(), 1024u);
}

TEST(OpenAiParse, BadLogitBiasIs400NamingLogitBias) {
  std::string too_many = R"("logit_bias": {)";
  for (int i = 0; i < 1025; ++i) too_many += (i ? ", \"" : "\"") + std::to_string(i) + "\": 1";
  too_many += "}";
  const std::string cases[] = {
      R"("logit_bias": [1])",
      R"("logit_bias": 5)",
      R"("logit_bias": "x")",
      R"("logit_bias": {"abc": 1})",
      R"("logit_bias": {"": 1})",
      R"("logit_bias": {"-1": 1})",
      R"("logit_bias": {"+1": 1})",
      R"("logit_bias": {" 1": 1})",
      R"("logit_bias": {"1.5": 1})",
      R"("logit_bias": {"1e3": 1})",
      R"("logit_bias": {"0x10": 1})",
      R"("logit_bias": {"2147483648": 1})",
      R"("logit_bias": {"99999999999999999999": 1})",
      R"("logit_bias": {"5": 100.5})",
      R"("logit_bias": {"5": -101})",
      R"("logit_bias": {"5": "10"})",
      R"("logit_bias": {"5": null})",
      R"("logit_bias": {"5": true})",
      R"("logit_bias": {"5": [1]})",
      R"("logit_bias": {"5": 1, "05": 2})",
      too_many,
  };
  for (const std::string& extra : cases) {
    const ApiError c = chat_error(chat_with(extra));
    EXPECT_EQ(c.status(), 400) << extra;
    EXPECT_EQ(c.param(), "logit_bias") << extra << ": " << c.what();
    EXPECT_EQ(c.type(), "invalid_request_error") << extra;
    const ApiError p = completion_error(completion_with(extra));
    EXPECT_EQ(p.status(), 400) << extra;
    EXPECT_EQ(p.param(), "logit_bias") << extra << ": " << p.what();
  }
  // An id past the model's vocabulary: known once the model is, at to_serve_request.
  const OpenAiRequest r =
      parse_completion_request(completion_with(R"("logit_bias": {"999": 1, "1000": 5})"));
  try {
    to_serve_request(r, {1, 2}, 100, kVocab);
    FAIL() << "expected a vocabulary error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "logit_bias");
    EXPECT_NE(std::string(e.what()).find("token id 1000"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
  EXPECT_EQ(to_serve_request(r, {1, 2}, 100, kVocab + 1).logit_bias.size(), 2u);
}

TEST(OpenAiParse, ChatFieldsMapToTheRequest) {
  const OpenAiRequest r = parse_chat_request(chat_with(R"(
      "model": "demo", "max_tokens": 9, "max_completion_tokens": 7, "temperature": 0.5,
      "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 42, "stop": "\n\n", "stream": true,
      "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3,
      "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
      "chat_template_kwargs": {"enable_thinking": false}, "user": "u", "unknown_field": [1, 2],
      "presence_penalty": null)"));
  EXPECT_EQ(r.kind, ApiKind::kChat);
  EXPECT_EQ(r.model, "demo");
  EXPECT_EQ(r.max_tokens, 7);  // max_completion_tokens wins over the deprecated max_tokens
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n\n"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_TRUE(r.chat.add_generation_prompt);  // the default here, unlike transformers'
  EXPECT_TRUE(r.chat.tools.is_list());
  EXPECT_EQ(r.chat.messages.as_list().size(), 1u);
  EXPECT_TRUE(r.chat.kwargs.find(std::string_view("enable_thinking")) != nullptr);

  const OpenAiRequest d = parse_chat_request("{" + kMsgs + "}");
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_EQ(d.top_logprobs, -1);
  EXPECT_FALSE(d.seed.has_value());
  const OpenAiRequest no_prompt =
      parse_chat_request(chat_with(R"("add_generation_prompt": false)"));
  EXPECT_FALSE(no_prompt.chat.add_generation_prompt);
  // logprobs without top_logprobs: the chosen token's only.
  EXPECT_EQ(parse_chat_request(chat_with(R"("logprobs": true)")).top_logprobs, 0);
  // top_k -1 is vLLM's "off".
  EXPECT_EQ(parse_chat_request(chat_with(R"("top_k": -1)")).sampling.top_k, 0);
}

// metrale's extension: a request may decode without the server's speculative drafts.
TEST(OpenAiParse, SpeculativeTurnsDraftsOffPerRequest) {
  EXPECT_TRUE(parse_chat_request("{" + kMsgs + "}").speculative);
  EXPECT_FALSE(parse_chat_request(chat_with(R"("speculative": false)")).speculative);
  const OpenAiRequest r = parse_completion_request(completion_with(R"("speculative": false)"));
  EXPECT_FALSE(r.speculative);
  EXPECT_FALSE(to_serve_request(r, {1, 2}, 100, kVocab).speculative);
}

// A speculative request's usage carries its drafts as OpenAI's predicted-output counts.
TEST(OpenAiResponse, UsageCountsAcceptedAndRejectedDrafts) {
  ServeUsage u{.prompt_tokens = 5, .completion_tokens = 9, .cached_tokens = 0};
  EXPECT_FALSE(usage_json(u).contains("completion_tokens_details"));
  u.speculative = true;
  u.draft_tokens = 12;
  u.accepted_draft_tokens = 7;
  const json j = usage_json(u);
  EXPECT_EQ(j["completion_tokens"], 9);
  EXPECT_EQ(j["completion_tokens_details"]["accepted_prediction_tokens"], 7);
  EXPECT_EQ(j["completion_tokens_details"]["rejected_prediction_tokens"], 5);
  const ServeUsage both[] = {u, u};
  EXPECT_EQ(combined_usage(both).accepted_draft_tokens, 14);
  EXPECT_EQ(combined_usage(both).draft_tokens, 24);
}

TEST(OpenAiParse, ChatKeepsTheRequestsKeyOrderForTheTemplate) {
  const OpenAiRequest r = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "f", "zeta": 1, "alpha": 2}}]})");
  const chat::ChatTemplate t =
      chat::ChatTemplate::from_string("{{ tools[0].function | tojson }}", "test");
  EXPECT_EQ(t.render(r.chat), R"({"name": "f", "zeta": 1, "alpha": 2})");
}

TEST(OpenAiParse, CompletionPrompts) {
  const OpenAiRequest text = parse_completion_request(R"({"prompt": "In the beginning"})");
  EXPECT_FALSE(text.prompt_is_ids);
  EXPECT_EQ(text.prompt_text, "In the beginning");
  const OpenAiRequest ids = parse_completion_request(R"({"prompt": [5, 6, 7], "logprobs": 2})");
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(ids.top_logprobs, 2);
  // A batch of one is that one prompt.
  EXPECT_EQ(parse_completion_request(R"({"prompt": ["x"]})").prompt_text, "x");
  EXPECT_EQ(parse_completion_request(R"({"prompt": [[1, 2]]})").prompt_ids,
            (std::vector<int32_t>{1, 2}));
}

TEST(OpenAiServeRequest, MaxTokensDefaultsToWhatTheContextLeaves) {
  OpenAiRequest r = parse_completion_request(R"({"prompt": "x", "temperature": 0, "seed": 3,
                                                 "stop": ["a", "b"], "logprobs": 1})");
  const ServeRequest s = to_serve_request(r, {1, 2, 3}, 100, kVocab);
  EXPECT_EQ(s.max_tokens, 97);
  EXPECT_EQ(s.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s.seed, 3u);
  EXPECT_FLOAT_EQ(s.sampling.temperature, 0.0f);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.top_logprobs, 1);
  EXPECT_EQ(s.presence_penalty, 0.0f);
  EXPECT_EQ(s.frequency_penalty, 0.0f);

  const OpenAiRequest p = parse_completion_request(
      R"({"prompt": "x", "presence_penalty": 0.5, "frequency_penalty": -1.25})");
  const ServeRequest sp = to_serve_request(p, {1}, 100, kVocab);
  EXPECT_FLOAT_EQ(sp.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(sp.frequency_penalty, -1.25f);

  r.max_tokens = 97;
  EXPECT_EQ(to_serve_request(r, {1, 2, 3}, 100, kVocab).max_tokens, 97);
  r.max_tokens = 98;
  try {
    to_serve_request(r, {1, 2, 3}, 100, kVocab);
    FAIL() << "expected a context-length error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "context_length_exceeded");
    EXPECT_NE(std::string(e.what()).find("maximum context length is 100"), std::string::npos);
  }
  r.max_tokens.reset();
  EXPECT_THROW(to_serve_request(r, std::vector<int32_t>(100, 1), 100, kVocab), ApiError);
  EXPECT_THROW(to_serve_request(r, {}, 100, kVocab), ApiError);
}

TEST(OpenAiResponse, ErrorShape) {
  const json e = json::parse(error_body(401, "invalid API key", "", "invalid_api_key"));
  EXPECT_EQ(e["error"]["message"], "invalid API key");
  EXPECT_EQ(e["error"]["type"], "authentication_error");
  EXPECT_TRUE(e["error"]["param"].is_null());
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  EXPECT_EQ(json::parse(error_body(429, "busy"))["error"]["type"], "rate_limit_error");
  EXPECT_EQ(json::parse(error_body(503, "stopping"))["error"]["type"], "server_error");
  EXPECT_EQ(json::parse(error_body(404, "no"))["error"]["type"], "not_found_error");
}

Collected collected(const std::string& text, FinishReason finish) {
  Collected c;
  ServeEvent e;
  e.text = text;
  e.done = true;
  e.finish = finish;
  e.usage = {.prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 2};
  c.add(e);
  return c;
}

TEST(OpenAiResponse, ChatCompletionShape) {
  const ResponseMeta meta{"chatcmpl-7", 1700000000, "demo"};
  const json j =
      chat_completion_json(meta, collected("Amen.", FinishReason::kStop), false, demo_tokenizer());
  EXPECT_EQ(j["id"], "chatcmpl-7");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "demo");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Amen.");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);

  const json t = text_completion_json({"cmpl-8", 1, "demo"}, collected("x", FinishReason::kLength),
                                      false, demo_tokenizer());
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "x");
  EXPECT_EQ(t["choices"][0]["finish_reason"], "length");
}

std::vector<TokenLogprob> sample_logprobs() {
  const std::vector<int32_t> ids = demo_tokenizer().encode("And God", false);
  std::vector<TokenLogprob> out;
  for (int32_t id : ids) {
    out.push_back({.id = id,
                   .logprob = -0.5f,
                   .top = {{id, -0.5f}, {0, -std::numeric_limits<float>::infinity()}}});
  }
  return out;
}

TEST(OpenAiResponse, LogprobsInEachApisFormat) {
  const Tokenizer& tok = demo_tokenizer();
  const std::vector<TokenLogprob> lps = sample_logprobs();
  const json chat = chat_logprobs_json(lps, tok);
  ASSERT_EQ(chat["content"].size(), lps.size());
  std::string joined;
  for (const json& c : chat["content"]) {
    joined += c["token"].get<std::string>();
    EXPECT_EQ(c["logprob"], -0.5);
    EXPECT_EQ(c["bytes"].size(), c["token"].get<std::string>().size());
    ASSERT_EQ(c["top_logprobs"].size(), 2u);
    EXPECT_EQ(c["top_logprobs"][0]["token"], c["token"]);
    EXPECT_EQ(c["top_logprobs"][1]["logprob"], -9999.0);  // -inf clamped: JSON has no inf
  }
  EXPECT_EQ(joined, "And God");

  const json comp = completion_logprobs_json(lps, tok, 10);
  ASSERT_EQ(comp["tokens"].size(), lps.size());
  EXPECT_EQ(comp["token_logprobs"][0], -0.5);
  EXPECT_EQ(comp["text_offset"][0], 10);
  EXPECT_EQ(comp["text_offset"][1],
            10 + static_cast<int>(comp["tokens"][0].get<std::string>().size()));
  EXPECT_TRUE(comp["top_logprobs"][0].is_object());
  EXPECT_EQ(comp["top_logprobs"][0].size(), 2u);
}

// Splits an SSE body into its data payloads.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end + 2;
  }
  return out;
}

TEST(OpenAiSse, ChatChunksInOpenAisOrder) {
  SseEncoder enc(ApiKind::kChat, {"chatcmpl-1", 5, "demo"}, false, /*include_usage=*/true,
                 demo_tokenizer());
  ServeEvent a;
  a.text = "And";
  ServeEvent b;
  b.text = " God";
  b.done = true;
  b.finish = FinishReason::kLength;
  b.usage = {.prompt_tokens = 4, .completion_tokens = 2, .cached_tokens = 0};
  std::string body = enc.encode(a);
  body += enc.encode(b);
  EXPECT_TRUE(enc.finished());
  const std::vector<std::string> p = sse_payloads(body);
  ASSERT_EQ(p.size(), 6u) << body;
  const json role = json::parse(p[0]);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["id"], "chatcmpl-1");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(json::parse(p[1])["choices"][0]["delta"]["content"], "And");
  EXPECT_EQ(json::parse(p[2])["choices"][0]["delta"]["content"], " God");
  const json last = json::parse(p[3]);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const json usage = json::parse(p[4]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 6);
  EXPECT_EQ(p[5], "[DONE]");
  EXPECT_EQ(enc.encode(b), "");  // nothing after the end
}

TEST(OpenAiSse, CompletionChunksAndLogprobs) {
  SseEncoder enc(ApiKind::kCompletion, {"cmpl-2", 5, "demo"}, /*logprobs=*/true, false,
                 demo_tokenizer());
  ServeEvent a;
  a.text = "And God";
  a.logprobs = sample_logprobs();
  ServeEvent b;
  b.text = " said";
  b.logprobs = {{.id = demo_tokenizer().encode(" said", false)[0], .logprob = -1.0f, .top = {}}};
  b.done = true;
  std::string body = enc.encode(a);
  body += enc.encode(b);
  const std::vector<std::string> p = sse_payloads(body);
  ASSERT_EQ(p.size(), 4u);
  const json first = json::parse(p[0]);
  EXPECT_EQ(first["object"], "text_completion");
  EXPECT_EQ(first["choices"][0]["text"], "And God");
  EXPECT_EQ(first["choices"][0]["logprobs"]["text_offset"][0], 0);
  // Offsets continue across chunks.
  EXPECT_EQ(json::parse(p[1])["choices"][0]["logprobs"]["text_offset"][0], 7);
  EXPECT_EQ(json::parse(p[2])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(p[3], "[DONE]");
}

TEST(OpenAiSse, AnEngineErrorEndsTheStreamWithAnErrorEvent) {
  SseEncoder enc(ApiKind::kChat, {"chatcmpl-3", 5, "demo"}, false, true, demo_tokenizer());
  ServeEvent e;
  e.done = true;
  e.finish = FinishReason::kError;
  e.error = "server stopping";
  const std::vector<std::string> p = sse_payloads(enc.encode(e));
  ASSERT_EQ(p.size(), 3u);  // role chunk, error, [DONE]
  const json err = json::parse(p[1]);
  EXPECT_NE(err["error"]["message"].get<std::string>().find("server stopping"), std::string::npos);
  EXPECT_EQ(err["error"]["type"], "server_error");
  EXPECT_EQ(p[2], "[DONE]");
}

TEST(OpenAiSse, InvalidUtf8NeverThrows) {
  EXPECT_EQ(sse_frame(json{{"t", std::string("\xe4\xb8")}}), "data: {\"t\":\"\xef\xbf\xbd\"}\n\n");
}

// ---- tool calls

const std::string kTools =
    R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
        {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])";

TEST(OpenAiTools, ToolsAndToolChoiceAreValidated) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("tools": [3])", "tools"},
      {R"("tools": [{"function": {"name": "f"}}])", "tools"},  // no type
      {R"("tools": [{"type": "retrieval"}])", "tools"},
      {R"("tools": [{"type": "function"}])", "tools"},
      {R"("tools": [{"type": "function", "function": {"name": ""}}])", "tools"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}])", "tools"},
      {kTools + R"(, "tool_choice": "sometimes")", "tool_choice"},
      {kTools + R"(, "tool_choice": 5)", "tool_choice"},
      {R"("skip_special_tokens": "no")", "skip_special_tokens"},
  };
  for (const auto& [extra, param] : cases) {
    const ApiError e = chat_error(chat_with(extra));
    EXPECT_EQ(e.status(), 400) << extra;
    EXPECT_EQ(e.param(), param) << extra << ": " << e.what();
  }
  // Forcing a call: "required" (any tool) or a named function; the reply is parsed for it.
  const OpenAiRequest required =
      parse_chat_request(chat_with(kTools + R"(, "tool_choice": "required")"));
  ASSERT_TRUE(required.forced_tool.has_value());
  EXPECT_EQ(*required.forced_tool, "");
  EXPECT_TRUE(required.wants_tool_calls);
  const OpenAiRequest named = parse_chat_request(chat_with(
      kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(named.forced_tool, std::optional<std::string>("get_weather"));
  for (const std::string& extra :
       {std::string(R"("tool_choice": "required")"),  // no tools
        kTools + R"(, "tool_choice": {"type": "function"})",
        kTools + R"(, "tool_choice": "required", "response_format": {"type": "json_object"})"}) {
    const ApiError e = chat_error(chat_with(extra));
    EXPECT_EQ(e.status(), 400) << extra;
  }
  // The grammar of a forced call: Hermes' markers around {"name", "arguments"}; a name not
  // among the tools, or a format without a forced form, is a 400 naming tool_choice.
  const GrammarSpec g =
      forced_tool_call_grammar(named.tools, "get_weather", chat::ToolCallFormat::kHermes);
  EXPECT_EQ(g.prefix, "<tool_call>\n");
  EXPECT_EQ(g.suffix, "\n</tool_call>");
  EXPECT_NE(g.text.find(R"("const":"get_weather")"), std::string::npos) << g.text;
  for (auto [name, format] : {std::pair{"nope", chat::ToolCallFormat::kHermes},
                              std::pair{"get_weather", chat::ToolCallFormat::kNone}}) {
    try {
      forced_tool_call_grammar(named.tools, name, format);
      ADD_FAILURE() << name;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), "tool_choice");
    }
  }
}

TEST(OpenAiStructured, EveryFieldSpellingReadsIntoOneGrammar) {
  using K = GrammarSpec::Kind;
  const std::tuple<std::string, K, std::string> cases[] = {
      {R"("response_format": {"type": "json_object"})", K::kJsonObject, "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true,
          "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}})",
       K::kJsonSchema, "response_format"},
      {R"("structured_outputs": {"regex": "[0-9]+"})", K::kRegex, "structured_outputs.regex"},
      {R"("structured_outputs": {"choice": ["a", "b"]})", K::kChoice, "structured_outputs.choice"},
      {R"("structured_outputs": {"grammar": "root ::= \"x\""})", K::kEbnf,
       "structured_outputs.grammar"},
      {R"("structured_outputs": {"json": "{\"type\": \"integer\"}"})", K::kJsonSchema,
       "structured_outputs.json"},
      {R"("guided_json": {"type": "object"})", K::kJsonSchema, "guided_json"},
      {R"("guided_regex": "a|b")", K::kRegex, "guided_regex"},
      {R"("guided_choice": ["yes", "no"])", K::kChoice, "guided_choice"},
      {R"("guided_grammar": "root ::= \"x\"")", K::kEbnf, "guided_grammar"},
  };
  for (const auto& [extra, kind, field] : cases) {
    for (const OpenAiRequest& r :
         {parse_chat_request(chat_with(extra)), parse_completion_request(completion_with(extra))}) {
      ASSERT_TRUE(r.grammar.has_value()) << extra;
      EXPECT_EQ(r.grammar->kind, kind) << extra;
      EXPECT_EQ(r.grammar->field, field) << extra;
    }
  }
  // A schema keeps the request's key order (the output writes properties in it).
  const OpenAiRequest r = parse_chat_request(chat_with(std::get<0>(cases[1])));
  EXPECT_LT(r.grammar->text.find("\"b\""), r.grammar->text.find("\"a\"")) << r.grammar->text;
  EXPECT_FALSE(parse_chat_request(chat_with(R"("response_format": {"type": "text"})")).grammar);
  const std::pair<std::string, std::string> bad[] = {
      {R"("guided_regex": "a", "guided_choice": ["a"])", "guided_choice"},
      {R"("structured_outputs": {"regex": "a", "choice": ["a"]})", "structured_outputs"},
      {R"("structured_outputs": {})", "structured_outputs"},
      {R"("structured_outputs": {"structural_tag": "x"})", "structured_outputs.structural_tag"},
      {R"("guided_choice": [])", "guided_choice"},
      {R"("guided_choice": ["a", 1])", "guided_choice"},
      {R"("guided_regex": 3)", "guided_regex"},
      {R"("guided_json": 3)", "guided_json"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"schema": 3}})",
       "response_format.json_schema.schema"},
  };
  for (const auto& [extra, param] : bad) {
    const ApiError e = chat_error(chat_with(extra));
    EXPECT_EQ(e.status(), 400) << extra;
    EXPECT_EQ(e.param(), param) << extra << ": " << e.what();
  }
}

TEST(OpenAiTools, WhenTheReplyIsParsedForToolCalls) {
  const OpenAiRequest with = parse_chat_request(chat_with(kTools));
  EXPECT_TRUE(with.wants_tool_calls);
  ASSERT_TRUE(with.tools.is_array());
  EXPECT_EQ(with.tools[0]["function"]["name"], "get_weather");
  EXPECT_TRUE(
      parse_chat_request(chat_with(kTools + R"(, "tool_choice": "auto")")).wants_tool_calls);
  EXPECT_FALSE(
      parse_chat_request(chat_with(kTools + R"(, "tool_choice": "none")")).wants_tool_calls);
  EXPECT_FALSE(parse_chat_request(chat_with(R"("tools": [])")).wants_tool_calls);
  EXPECT_FALSE(parse_chat_request(chat_with(R"("tools": null)")).wants_tool_calls);
  EXPECT_FALSE(parse_chat_request("{" + kMsgs + "}").wants_tool_calls);

  // Special tokens stay in the text when the parser's markers are special tokens, or when the
  // request asks (vLLM's skip_special_tokens).
  using chat::ToolCallFormat;
  EXPECT_TRUE(
      to_serve_request(with, {1, 2}, 100, kVocab, ToolCallFormat::kHermes).skip_special_tokens);
  EXPECT_FALSE(
      to_serve_request(with, {1, 2}, 100, kVocab, ToolCallFormat::kMistral).skip_special_tokens);
  EXPECT_FALSE(
      to_serve_request(with, {1, 2}, 100, kVocab, ToolCallFormat::kLlama3Json).skip_special_tokens);
  EXPECT_TRUE(to_serve_request(with, {1, 2}, 100, kVocab).skip_special_tokens);
  const OpenAiRequest keep = parse_chat_request(chat_with(R"("skip_special_tokens": false)"));
  EXPECT_FALSE(to_serve_request(keep, {1, 2}, 100, kVocab).skip_special_tokens);
}

TEST(OpenAiTools, ArgumentsGivenAsJsonTextReachTheTemplateAsObjects) {
  // What the OpenAI SDK sends back on the next turn: arguments as JSON text.
  const OpenAiRequest r = parse_chat_request(R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3}"}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_time", "arguments": "not json"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})");
  // Qwen3.5's template iterates the arguments as a mapping; text that is not an object stays
  // text.
  const chat::ChatTemplate t = chat::ChatTemplate::from_string(
      "{% for m in messages %}{% for c in m.tool_calls or [] %}"
      "{% if c.function.arguments is mapping %}{% for k, v in c.function.arguments|items %}"
      "{{ k }}={{ v }};{% endfor %}{% else %}[{{ c.function.arguments }}]{% endif %}"
      "{% endfor %}{% endfor %}",
      "test");
  EXPECT_EQ(t.render(r.chat), "city=Paris;days=3;[not json]");
}

TEST(OpenAiTools, AWholeReplyCarriesContentAndToolCalls) {
  const ResponseMeta meta{"chatcmpl-9", 1, "demo"};
  const ReplyFormat hermes{.tool_calls = chat::ToolCallFormat::kHermes,
                           .tools = json::parse("{" + kTools + "}")["tools"]};
  const std::string text =
      "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Rome\"}}\n</tool_call>";
  const json j = chat_completion_json(meta, collected(text, FinishReason::kStop), false,
                                      demo_tokenizer(), hermes);
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Checking.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 2u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city": "Paris"})"));
  EXPECT_FALSE(call.contains("index"));  // only streamed deltas have one
  const std::string id0 = call["id"], id1 = choice["message"]["tool_calls"][1]["id"];
  EXPECT_TRUE(id0.starts_with("call_")) << id0;
  EXPECT_EQ(id0.size(), 29u);
  EXPECT_NE(id0, id1);

  // Only calls: content is null. Cut by max_tokens: "length" still wins.
  const std::string only = text.substr(std::string("Checking.").size());
  const json o = chat_completion_json(meta, collected(only, FinishReason::kLength), false,
                                      demo_tokenizer(), hermes);
  EXPECT_TRUE(o["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(o["choices"][0]["finish_reason"], "length");

  // No call, or a malformed one: all content, no tool_calls key, "stop".
  for (const std::string& plain :
       {std::string("Just text."), std::string("<tool_call>{not json}</tool_call>")}) {
    const json p = chat_completion_json(meta, collected(plain, FinishReason::kStop), false,
                                        demo_tokenizer(), hermes);
    EXPECT_EQ(p["choices"][0]["message"]["content"], plain);
    EXPECT_FALSE(p["choices"][0]["message"].contains("tool_calls"));
    EXPECT_EQ(p["choices"][0]["finish_reason"], "stop");
  }

  // Mistral's ids are 9 letters and digits (its templates refuse others on the next turn).
  const std::string mid = new_tool_call_id(chat::ToolCallFormat::kMistral);
  EXPECT_EQ(mid.size(), 9u);
  EXPECT_TRUE(std::all_of(mid.begin(), mid.end(), [](char ch) { return std::isalnum(ch); }));
}

TEST(OpenAiTools, StreamedCallsAreOneDeltaEachWhateverTheSplit) {
  const std::string text =
      "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 3}}\n</tool_call>";
  for (size_t cut = 0; cut <= text.size(); cut += 7) {
    SseEncoder enc(ApiKind::kChat, {"chatcmpl-3", 5, "demo"}, false, false, demo_tokenizer(),
                   {.tool_calls = chat::ToolCallFormat::kHermes});
    ServeEvent a, b;
    a.text = text.substr(0, cut);
    b.text = text.substr(cut);
    b.done = true;
    b.finish = FinishReason::kStop;
    std::string body = enc.encode(a);  // in order: the operands of + are unsequenced
    body += enc.encode(b);
    const std::vector<std::string> p = sse_payloads(body);
    std::string content;
    std::vector<json> calls;
    std::string finish;
    for (const std::string& payload : p) {
      if (payload == "[DONE]") continue;
      const json c = json::parse(payload)["choices"][0];
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("tool_calls")) {
        for (const json& call : c["delta"]["tool_calls"]) calls.push_back(call);
      }
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(content, "Checking.") << cut;
    ASSERT_EQ(calls.size(), 1u) << cut;
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_TRUE(calls[0]["id"].get<std::string>().starts_with("call_"));
    EXPECT_EQ(calls[0]["type"], "function");
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()),
              json::parse(R"({"city": "Paris", "days": 3})"));
    EXPECT_EQ(finish, "tool_calls") << cut;
    EXPECT_EQ(p.back(), "[DONE]");
  }
}

// Reasoning (a <think> block the prompt opened), then a call in qwen3_coder's format, typed by
// the tool schema: the reply as Qwen3.5 writes it.
TEST(OpenAiTools, ReasoningThenACall) {
  const ReplyFormat qwen35{.reasoning = chat::ReasoningFormat::kThink,
                           .reasoning_starts_open = true,
                           .tool_calls = chat::ToolCallFormat::kQwen3Coder,
                           .tools = json::parse("{" + kTools + "}")["tools"]};
  const std::string text =
      "Let me check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  const json whole =
      chat_completion_json({"chatcmpl-4", 1, "demo"}, collected(text, FinishReason::kStop), false,
                           demo_tokenizer(), qwen35)["choices"][0];
  EXPECT_EQ(whole["message"]["reasoning_content"], "Let me check.");
  EXPECT_TRUE(whole["message"]["content"].is_null());
  ASSERT_EQ(whole["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(
      json::parse(whole["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
      json::parse(R"({"city": "Paris", "days": 3})"));
  EXPECT_EQ(whole["finish_reason"], "tool_calls");

  // Streamed one byte per event: the same reasoning, content and call.
  SseEncoder enc(ApiKind::kChat, {"chatcmpl-5", 1, "demo"}, false, false, demo_tokenizer(), qwen35);
  std::string body;
  for (size_t i = 0; i < text.size(); ++i) {
    ServeEvent e;
    e.text = text.substr(i, 1);
    e.done = i + 1 == text.size();
    body += enc.encode(e);
  }
  std::string reasoning, content;
  int calls = 0;
  for (const std::string& payload : sse_payloads(body)) {
    if (payload == "[DONE]") continue;
    const json d = json::parse(payload)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) calls += static_cast<int>(d["tool_calls"].size());
  }
  EXPECT_EQ(reasoning, "Let me check.");
  EXPECT_EQ(content, "");
  EXPECT_EQ(calls, 1);

  // include_reasoning: false drops it; without a reasoning format it stays in the content.
  ReplyFormat hidden = qwen35;
  hidden.include_reasoning = false;
  const json h =
      chat_completion_json({"chatcmpl-6", 1, "demo"}, collected(text, FinishReason::kStop), false,
                           demo_tokenizer(), hidden)["choices"][0]["message"];
  EXPECT_FALSE(h.contains("reasoning_content"));
  ReplyFormat plain = qwen35;
  plain.reasoning = chat::ReasoningFormat::kNone;
  const json p =
      chat_completion_json({"chatcmpl-7", 1, "demo"}, collected(text, FinishReason::kStop), false,
                           demo_tokenizer(), plain)["choices"][0]["message"];
  EXPECT_EQ(p["content"], "Let me check.\n</think>\n\n");
  EXPECT_FALSE(parse_chat_request(chat_with(R"("include_reasoning": false)")).include_reasoning);
}

TEST(OpenAiChoices, NAndTheSeedsOfTheChoices) {
  EXPECT_EQ(parse_chat_request(chat_with(R"("n": 3)")).n, 3);
  EXPECT_EQ(parse_completion_request(completion_with(R"("n": 16)")).n, 16);
  EXPECT_EQ(parse_chat_request("{" + kMsgs + "}").n, 1);
  for (const char* bad : {R"("n": 0)", R"("n": 17)", R"("n": 2.5)", R"("n": "2")"}) {
    EXPECT_EQ(chat_error(chat_with(bad)).param(), "n") << bad;
    EXPECT_EQ(completion_error(completion_with(bad)).param(), "n") << bad;
  }
  // Choice i samples with seed + i: it equals the same request with n = 1 and that seed.
  const OpenAiRequest r = parse_completion_request(completion_with(R"("n": 3, "seed": 40)"));
  const std::vector<ServeRequest> c = choice_requests(r, to_serve_request(r, {1, 2}, 100, 1000));
  ASSERT_EQ(c.size(), 3u);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].seed, 40 + i);
    EXPECT_EQ(c[i].prompt, (std::vector<int32_t>{1, 2}));
  }
  // Without a seed each choice draws its own.
  const OpenAiRequest u = parse_completion_request(completion_with(R"("n": 2)"));
  const std::vector<ServeRequest> d = choice_requests(u, to_serve_request(u, {1}, 100, 1000));
  EXPECT_NE(d[0].seed, d[1].seed);
}

TEST(OpenAiChoices, WholeRepliesListEveryChoiceAndAddTheirTokens) {
  std::vector<Collected> cs = {collected("Amen.", FinishReason::kStop),
                               collected("Selah", FinishReason::kLength)};
  cs[1].usage.completion_tokens = 4;
  const json chat = chat_completion_json({"chatcmpl-1", 1, "demo"}, cs, false, demo_tokenizer());
  ASSERT_EQ(chat["choices"].size(), 2u);
  EXPECT_EQ(chat["choices"][1]["index"], 1);
  EXPECT_EQ(chat["choices"][1]["message"]["content"], "Selah");
  EXPECT_EQ(chat["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(chat["usage"]["prompt_tokens"], 5);  // the prompt once
  EXPECT_EQ(chat["usage"]["completion_tokens"], 3 + 4);
  EXPECT_EQ(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  const json text = text_completion_json({"cmpl-1", 1, "demo"}, cs, false, demo_tokenizer());
  EXPECT_EQ(text["choices"][0]["text"], "Amen.");
  EXPECT_EQ(text["choices"][1]["index"], 1);
  EXPECT_EQ(text["usage"]["total_tokens"], 5 + 7);
}

TEST(OpenAiChoices, StreamedChoicesInterleaveAndEndTogether) {
  SseEncoder enc(ApiKind::kChat, {"chatcmpl-2", 1, "demo"}, false, /*include_usage=*/true,
                 demo_tokenizer(), {}, /*n_choices=*/2);
  auto event = [](std::string text, bool done, int64_t tokens) {
    ServeEvent e;
    e.text = std::move(text);
    e.done = done;
    e.finish = FinishReason::kLength;
    e.usage = {.prompt_tokens = 4, .completion_tokens = tokens, .cached_tokens = 0};
    return e;
  };
  std::string body = enc.encode(event("A", false, 0), 1);
  body += enc.encode(event("B", false, 0), 0);
  body += enc.encode(event("C", true, 2), 1);
  EXPECT_FALSE(enc.finished());  // choice 0 still runs: no usage, no [DONE] yet
  EXPECT_EQ(body.find("[DONE]"), std::string::npos);
  body += enc.encode(event("D", true, 3), 0);
  EXPECT_TRUE(enc.finished());
  std::string text[2];
  int finals = 0;
  json usage;
  const std::vector<std::string> p = sse_payloads(body);
  for (const std::string& payload : p) {
    if (payload == "[DONE]") continue;
    const json j = json::parse(payload);
    if (j["choices"].empty()) {
      usage = j["usage"];
      continue;
    }
    const json& c = j["choices"][0];
    const int i = c["index"];
    if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finals;
  }
  EXPECT_EQ(text[0], "BD");
  EXPECT_EQ(text[1], "AC");
  EXPECT_EQ(finals, 2);
  EXPECT_EQ(usage["prompt_tokens"], 4);
  EXPECT_EQ(usage["completion_tokens"], 5);
  EXPECT_EQ(p.back(), "[DONE]");
  EXPECT_EQ(std::count(p.begin(), p.end(), "[DONE]"), 1);

  // An error in one choice ends the whole stream at once.
  SseEncoder failing(ApiKind::kCompletion, {"cmpl-3", 1, "demo"}, false, false, demo_tokenizer(),
                     {}, 2);
  ServeEvent boom;
  boom.done = true;
  boom.finish = FinishReason::kError;
  boom.error = "out of memory";
  const std::string end = failing.encode(boom, 1);
  EXPECT_NE(end.find("out of memory"), std::string::npos);
  EXPECT_NE(end.find("[DONE]"), std::string::npos);
  EXPECT_TRUE(failing.finished());
  EXPECT_EQ(failing.encode(event("late", true, 1), 0), "");
}

TEST(Tokenize, RoundTripAndPieces) {
  const Tokenizer& tok = demo_tokenizer();
  const json ids = json::parse(tokenize_response(R"({"content": "And God said"})", tok));
  EXPECT_EQ(ids["tokens"].get<std::vector<int32_t>>(), tok.encode("And God said", false));
  const json back = json::parse(detokenize_response(json{{"tokens", ids["tokens"]}}.dump(), tok));
  EXPECT_EQ(back["content"], "And God said");
  const json pieces =
      json::parse(tokenize_response(R"({"content": "And God", "with_pieces": true})", tok));
  std::string joined;
  for (const json& p : pieces["tokens"]) {
    EXPECT_TRUE(p["id"].is_number_integer());
    joined += p["piece"].get<std::string>();
  }
  EXPECT_EQ(joined, "And God");
}

TEST(Tokenize, BadInputIs400) {
  const Tokenizer& tok = demo_tokenizer();
  for (const std::string body : {"{}", R"({"content": 5})", R"({"content": "x", "add_special": 1})",
                                 "[", "{\"content\": \"x\", \"with_pieces\": \"y\"}"}) {
    EXPECT_THROW(tokenize_response(body, tok), ApiError) << body;
  }
  for (const std::string body :
       {R"({"tokens": [-1]})", R"({"tokens": [99999]})", R"({"tokens": "1,2"})",
        R"({"tokens": [1.5]})", R"({"tokens": [3000000000]})"}) {
    try {
      detokenize_response(body, tok);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body;
      EXPECT_EQ(e.param(), "tokens") << body;
    }
  }
}

}  // namespace
}  // namespace metrale::http
