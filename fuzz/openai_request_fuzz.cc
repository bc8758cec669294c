// libFuzzer target for the OpenAI request parser of `metrale serve`: any body must become a
// request or an http::ApiError (a 400 to the client), never a crash, sanitizer report, hang or
// a stray exception of another type (which the server would answer with a 500).
// The first byte picks the endpoint (chat, completions, /tokenize, /detokenize,
// /v1/embeddings); the rest is the body. A chat request that parses is rendered with a small
// template and tokenized, and every request that parses is mapped to a ServeRequest against a
// 1024-token context and its responses formatted, as the server does. A chat's reply is its
// rendered prompt (which holds whatever the messages hold, markers included), split for reasoning
// and, when the request has tools, for tool calls in a format picked by the prompt's length.
//
//   ./openai_request_fuzz -dict=fuzz/openai_request.dict -max_len=4096 /tmp/openai_corpus
// (it reads models/demo/tokenizer.json under the source tree: fuzz_source.h)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "core/error.h"
#include "fuzz_source.h"
#include "http/openai_api.h"
#include "http/openai_embeddings.h"
#include "io/tokenizer/tokenizer.h"

namespace {

using namespace metrale;

const Tokenizer& tokenizer() {
  static const Tokenizer tok =
      Tokenizer::from_file(fuzz::source_path("models/demo/tokenizer.json"));
  return tok;
}

const chat::ChatTemplate& chat_template() {
  static const chat::ChatTemplate t = chat::ChatTemplate::from_string(
      "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
      "{% if tools %}{{ tools | tojson }}{% endif %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}",
      "fuzz-template");
  return t;
}

void respond(const http::OpenAiRequest& r, std::vector<int32_t> prompt,
             std::string_view rendered = {}) {
  http::ReplyFormat reply;
  if (r.kind == http::ApiKind::kChat) {
    reply.reasoning = chat::ReasoningFormat::kThink;
    reply.reasoning_starts_open = chat::prompt_opens_reasoning(rendered);
    reply.include_reasoning = r.include_reasoning;
    if (r.wants_tool_calls) {
      reply.tool_calls = static_cast<chat::ToolCallFormat>(1 + rendered.size() % 6);
    }
    reply.tools = r.tools;
  }
  const ServeRequest s = http::to_serve_request(
      r, std::move(prompt), 1024, static_cast<int64_t>(tokenizer().id_limit()), reply.tool_calls);
  // Format what a stream of these prompt tokens would send back.
  ServeEvent e;
  e.text = r.kind == http::ApiKind::kChat
               ? std::string(rendered)
               : tokenizer().decode(
                     std::span<const int32_t>(s.prompt).first(std::min<size_t>(s.prompt.size(), 4)),
                     false);
  for (int32_t id : s.prompt)
    e.logprobs.push_back({.id = id, .logprob = -1.0f, .top = {{id, -1.0f}}});
  e.done = true;
  e.finish = s.max_tokens % 2 ? FinishReason::kStop : FinishReason::kLength;
  (void)http::choice_requests(r, s);
  http::SseEncoder enc(r.kind, {"id-1", 0, r.model}, r.top_logprobs >= 0, r.include_usage,
                       tokenizer(), reply, r.n);
  // Every choice streamed in two events split mid-text, as tokens arrive, the choices
  // interleaved.
  ServeEvent first;
  first.text = e.text.substr(0, e.text.size() / 2);
  ServeEvent last = e;
  last.text = e.text.substr(first.text.size());
  for (int i = 0; i < r.n; ++i) (void)enc.encode(first, i);
  for (int i = r.n - 1; i >= 0; --i) (void)enc.encode(last, i);
  std::vector<http::Collected> choices(static_cast<size_t>(r.n));
  for (http::Collected& c : choices) {
    ServeEvent copy = e;
    c.add(copy);
  }
  (void)http::dump_json(
      r.kind == http::ApiKind::kChat
          ? http::chat_completion_json({"id", 0, r.model}, choices, true, tokenizer(), reply)
          : http::text_completion_json({"id", 0, r.model}, choices, true, tokenizer()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 5) {
      case 0: {
        const http::OpenAiRequest r = http::parse_chat_request(body);
        std::string text;
        try {
          text = chat_template().render(r.chat);
        } catch (const Error&) {
          return 0;  // the server answers 400
        }
        respond(r, tokenizer().encode(text, false), text);
        break;
      }
      case 1: {
        const http::OpenAiRequest r = http::parse_completion_request(body);
        std::vector<int32_t> prompt =
            r.prompt_is_ids ? r.prompt_ids : tokenizer().encode(r.prompt_text, true);
        // Ids past the vocabulary are the scheduler's to refuse; keep the formatting in range.
        for (int32_t& id : prompt) id %= static_cast<int32_t>(tokenizer().id_limit());
        respond(r, std::move(prompt));
        break;
      }
      case 2:
        (void)http::tokenize_response(body, tokenizer());
        break;
      case 4: {
        // An embedding of each input's first values, formatted both ways.
        const http::EmbeddingsRequest r = http::parse_embeddings_request(body);
        std::vector<std::vector<float>> out;
        for (size_t i = 0; i < r.size() && i < 8; ++i) {
          const std::vector<int32_t> ids =
              r.input_is_ids ? r.ids[i] : tokenizer().encode(r.texts[i], true);
          std::vector<float> v;
          for (size_t k = 0; k < ids.size() && k < 5; ++k) v.push_back(static_cast<float>(ids[k]));
          out.push_back(std::move(v));
        }
        (void)http::dump_json(http::embeddings_json(r.model, out, r.base64, 1));
        (void)http::dump_json(http::embeddings_json(r.model, out, !r.base64, 1));
        break;
      }
      default:
        (void)http::detokenize_response(body, tokenizer());
        break;
    }
  } catch (const http::ApiError&) {
  } catch (const Error&) {
  }
  return 0;
}
