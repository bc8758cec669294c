#pragma once
// `metrale serve`'s HTTP front: an OpenAI-compatible server over cpp-httplib (0.11) and the
// Scheduler (serve/scheduler.h).
//
//   POST /v1/chat/completions   chat template rendered here, then generation (SSE when stream)
//   POST /v1/completions        text or token-id prompt
//   POST /v1/embeddings         pooled embeddings (Scheduler embedding requests)
//   GET  /v1/models             the one model served
//   POST /tokenize, /detokenize llama-server's shapes
//   GET  /health                {"status": "ok"}; 503 {"status": "draining"} while draining;
//                               never needs the API key
//   GET  /metrics               Prometheus text: scheduler, KV pages, prefix cache, HTTP codes
//
// Threads: cpp-httplib serves each connection on a thread of its pool; a generation request
// holds its thread while it waits on its ServeStream (the engine runs on the scheduler's one
// thread), so the pool is sized for the concurrent streams wanted (default 128 >= 64 streaming
// clients + idle keep-alive connections).
//
// Lifecycle: drain() is the graceful stop (SIGTERM in `metrale serve`): /health turns 503 so a
// router stops sending, new generation requests get 503 with Retry-After (a router retries them
// on another replica), requests already admitted run to their end; past the drain timeout what
// still runs is ended cleanly (a stream with an error event and [DONE], a waiting request with a
// 503), then the server stops. stop() is the hard stop.
//
// Bad clients are bounded by the limits below (http/connection_guard.h enforces the connection
// count and the whole-head / whole-body deadlines httplib 0.11 lacks). Bad input never takes
// the server down: bodies over max_body_bytes are 413 (Content-Length
// or chunked), malformed JSON and wrong types are 400 in OpenAI's error shape, a client that
// sends too slowly hits read_timeout, and a client that goes away mid-request cancels its
// ServeStream (streaming: a failed SSE write or a dead socket; non-streaming: its socket is
// polled while waiting), so its sequence leaves the batch at the next step.
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "http/media_parts.h"
#include "serve/scheduler.h"

namespace metrale::http {

// How long drain() waits, after its timeout, for the requests it ended to write their last
// event (each notices within poll_interval; this bounds a client that stopped reading).
inline constexpr std::chrono::milliseconds kDrainEndGrace{2000};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (bind() returns it)
  std::string api_key;  // non-empty: every endpoint but /health needs "Authorization: Bearer KEY"
  std::string model_name;  // the id /v1/models lists and responses carry; "": the model dir's name
  // LoRA adapters loaded in the model's pool: a request whose "model" names one runs with it
  // (vLLM's convention); /v1/models lists them beside the base model.
  std::vector<std::string> adapters;
  // How a chat reply to a request with tools is parsed into tool_calls (chat/tool_calls.h);
  // kNone: the reply stays text. `metrale serve` detects it from the chat template.
  chat::ToolCallFormat tool_call_format = chat::ToolCallFormat::kNone;
  // How the template writes a call of that format (a forced tool_choice is written so).
  chat::ToolCallSpelling tool_call_spelling = chat::ToolCallSpelling::kDefault;
  // Whether chat replies have their <think> block split out as reasoning_content
  // (chat/reasoning.h); `metrale serve` detects it from the chat template.
  chat::ReasoningFormat reasoning_format = chat::ReasoningFormat::kNone;
  // Why /v1/embeddings is refused when the scheduler has no embedding config (`metrale
  // serve`: the error reading the checkpoint's sentence-transformers files).
  std::string embeddings_unavailable = "this server was started without embeddings";
  // Images and videos in chat content parts: where file:// URLs may read, and the limits.
  MediaOptions media;
  // Limits on what a client may hold (docs/reliability.md has the table of what each guards).
  size_t max_body_bytes = size_t{16} << 20;
  // Structured outputs: the largest schema / regex / grammar / choice list a request may bring
  // (a 400 naming the field beyond it); compiling is the costly part.
  size_t max_grammar_bytes = size_t{64} << 10;
  std::chrono::seconds read_timeout{30};   // a client silent this long mid-request is dropped
  std::chrono::seconds write_timeout{30};  // a client not reading this long is dropped
  int threads = 128;                       // connections served at once
  int max_connections = 512;  // open connections (served + waiting); beyond: 503, closed
  // A request's whole head must arrive within head_timeout of the connection's start or its
  // previous response (keep-alive wait included), its whole body within body_timeout after.
  std::chrono::seconds head_timeout{15};
  std::chrono::seconds body_timeout{60};
  int max_headers = 100;                       // header fields per request; beyond: 431
  std::chrono::seconds keep_alive_timeout{5};  // an idle keep-alive connection is closed
  int keep_alive_max = 100;                    // requests per connection before it is closed
  // How often a handler waiting for tokens checks that its client is still there.
  std::chrono::milliseconds poll_interval{50};
};

class HttpServer {
 public:
  // `scheduler` (and its model, which must have a tokenizer) must outlive the server.
  // `chat_template`: none serves no chat (400 naming --chat-template).
  HttpServer(Scheduler& scheduler, std::optional<chat::ChatTemplate> chat_template,
             HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port; returns the port (the chosen one for port 0). Error when it cannot.
  int bind();
  // Serves until stop(); call after bind(). Returns when every connection thread is done.
  void listen();
  // From any thread (not a signal handler): stops accepting, ends waiting requests (503) and
  // streams (their ServeStreams are cancelled), and makes listen() return.
  void stop();
  // The graceful stop, from any thread (not a signal handler): drains (above) for up to
  // `timeout`, ends what still runs then (waiting at most kDrainEndGrace for those requests to
  // write their last bytes), and stop()s. Returns the number of requests that had to be ended
  // (0: all finished by themselves). A stop() meanwhile cuts it short.
  int64_t drain(std::chrono::milliseconds timeout);
  bool draining() const;
  // Generation requests admitted and not yet answered.
  int64_t requests_in_flight() const;
  int port() const;
  const std::string& model_name() const;

  // The /metrics text.
  std::string metrics() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace metrale::http
