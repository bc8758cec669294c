// The OpenAI request parser (every class of bad input is a 400 naming the field) and the
// response shapes (chat.completion, text_completion, their SSE chunks, logprobs, usage).
#include "http/openai_api.h"

#include <gtest/gtest.h>

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
      {chat_with(R"("response_format": {"type": "json_object"})"), "response_format"},
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
  for (const std::string extra : {R"("n": 2)", R"("logit_bias": {"5": 10})"}) {
    const ApiError e = chat_error(chat_with(extra));
    EXPECT_EQ(e.status(), 400) << extra;
    EXPECT_EQ(e.code(), "unsupported_parameter") << extra;
  }
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

TEST(OpenAiParse, ChatKeepsTheRequestsKeyOrderForTheTemplate) {
  const OpenAiRequest r = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"zeta": 1, "alpha": 2}]})");
  const chat::ChatTemplate t = chat::ChatTemplate::from_string("{{ tools[0] | tojson }}", "test");
  EXPECT_EQ(t.render(r.chat), R"({"zeta": 1, "alpha": 2})");
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
  const ServeRequest s = to_serve_request(r, {1, 2, 3}, 100);
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
  const ServeRequest sp = to_serve_request(p, {1}, 100);
  EXPECT_FLOAT_EQ(sp.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(sp.frequency_penalty, -1.25f);

  r.max_tokens = 97;
  EXPECT_EQ(to_serve_request(r, {1, 2, 3}, 100).max_tokens, 97);
  r.max_tokens = 98;
  try {
    to_serve_request(r, {1, 2, 3}, 100);
    FAIL() << "expected a context-length error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "context_length_exceeded");
    EXPECT_NE(std::string(e.what()).find("maximum context length is 100"), std::string::npos);
  }
  r.max_tokens.reset();
  EXPECT_THROW(to_serve_request(r, std::vector<int32_t>(100, 1), 100), ApiError);
  EXPECT_THROW(to_serve_request(r, {}, 100), ApiError);
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
