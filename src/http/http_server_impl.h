#pragma once
// HttpServer's state (its Impl) and the helpers its two source files share: http_server.cc
// (routes, auth, metrics, embeddings, lifecycle) and http_generate.cc (the generation
// endpoints: prompt, media, grammar, the whole and streaming responses). Internal to
// metrale_http.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include "http/connection_guard.h"
#include "http/http_server.h"
#include "http/lifecycle.h"
#include "http/openai_api.h"
#include "io/tokenizer/tokenizer.h"

namespace metrale::http {

inline constexpr const char* kJson = "application/json";

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline void send_json(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, kJson);
}

inline void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status(), dump_json(e.to_json()));
}

// A choice that ended without its text (cancelled, timed out, failed) fails its request.
inline bool failed(FinishReason r) {
  return r != FinishReason::kStop && r != FinishReason::kLength;
}

// How long a handler waits on each of a request's n streams per round: a share of the
// poll interval, so the client is still checked every poll_interval.
inline std::chrono::milliseconds wait_per_stream(std::chrono::milliseconds poll_interval,
                                                 size_t n) {
  return std::max(std::chrono::milliseconds(1), poll_interval / static_cast<int64_t>(n));
}

// The socket of the connection `req` came on (sockets.h), -1 when not found.
int find_connection_socket(const httplib::Request& req);

struct HttpServer::Impl {
  Scheduler& scheduler;
  const Model& model;
  const Tokenizer& tok;
  std::optional<chat::ChatTemplate> chat_template;
  HttpServerOptions options;
  std::string model_name;
  int64_t created = unix_now();
  ConnectionGuard guard;  // before server: its task queues share the guard's state
  httplib::Server server;
  int port = -1;
  std::atomic<bool> stopping{false};
  std::atomic<bool> listening{false};  // inside listen()
  Lifecycle lifecycle;                 // drain(): admissions and the requests in flight

  // Counters the scheduler does not keep.
  mutable std::mutex metrics_mu;
  std::map<int, int64_t> responses_by_status;                       // guarded by metrics_mu
  std::map<std::pair<std::string, std::string>, int64_t> finishes;  // (endpoint, reason)
  std::atomic<int64_t> client_disconnects{0};
  std::atomic<int64_t> render_ids{0};  // the Renderer API's request ids

  // Structured outputs: the compiler over the model's tokenizer, made at the first request
  // that needs it (its vocabulary tables take a moment for a 150k vocabulary).
  std::once_flag grammar_once;
  std::unique_ptr<GrammarCompiler> grammar_compiler;
  std::shared_ptr<const CompiledGrammar> compile_grammar(const GrammarSpec& spec);

  Impl(Scheduler& s, std::optional<chat::ChatTemplate> t, HttpServerOptions o)
      : scheduler(s),
        model(s.model()),
        tok(*s.model().tokenizer()),
        chat_template(std::move(t)),
        options(std::move(o)),
        guard(ConnectionLimits{
            .threads = options.threads,
            .max_connections = options.max_connections,
            .head_timeout =
                std::chrono::duration_cast<std::chrono::milliseconds>(options.head_timeout),
            .body_timeout =
                std::chrono::duration_cast<std::chrono::milliseconds>(options.body_timeout)}) {
    model_name = options.model_name.empty() ? model.dir().filename().string() : options.model_name;
    if (model_name.empty()) model_name = model.dir().parent_path().filename().string();
    setup();
  }

  // A generation request refused because the server drains: 503 with Retry-After, and the
  // connection closed (a router's next attempt goes to another replica; a keep-alive client
  // reconnects, through the router, elsewhere).
  ApiError refuse_draining(httplib::Response& res) const {
    res.set_header("Retry-After", std::to_string(lifecycle.retry_after_seconds()));
    res.set_header("Connection", "close");
    return ApiError(503, "the server is draining (shutting down); retry on another replica", "", "",
                    "server_draining");
  }

  void count_finish(const char* endpoint, FinishReason r) {
    std::lock_guard lock(metrics_mu);
    ++finishes[{endpoint, std::string(finish_reason_name(r))}];
  }

  void setup();
  std::string read_body(const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& reader) const;
  // The prompt's ids; a chat's rendered text goes to `rendered`.
  std::vector<int32_t> encode_prompt(const OpenAiRequest& r, std::string& rendered) const;
  // The request's media parts read, decoded and preprocessed, and `prompt`'s placeholders
  // expanded for them (place_media); the items in placeholder order. 400 naming the part.
  std::vector<vision::VisionItem> load_media(const OpenAiRequest& r,
                                             std::vector<int32_t>& prompt) const;
  std::shared_ptr<ServeStream> submit(ServeRequest request) const;
  void generate(ApiKind kind, const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader);
  // The request as the generation endpoint would prefill it (vLLM's Renderer API,
  // generate_request_json), validated the same way; nothing is submitted.
  void render(ApiKind kind, const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader& reader);
  // What generate() and render() share: the request read, its adapter, prompt and media, as the
  // scheduler takes it (`reply` filled for a chat).
  ServeRequest build_request(ApiKind kind, const OpenAiRequest& r, ReplyFormat& reply) const;
  // The adapter a request's `model` names ("" for the base model; 404 when it names neither).
  std::string adapter_of(const std::string& requested) const;
  void embeddings(const httplib::Request& req, httplib::Response& res,
                  const httplib::ContentReader& reader);
  // reply: how a chat's text is split (reasoning, tool calls, content).
  // streams: one per choice (n), in order.
  using Streams = std::vector<std::shared_ptr<ServeStream>>;
  // `admitted`: the request's Lifecycle token, held until the stream's last byte.
  void respond_streaming(ApiKind kind, const OpenAiRequest& r, const ReplyFormat& reply,
                         Streams streams, ResponseMeta meta, std::shared_ptr<void> admitted,
                         httplib::Response& res);
  void respond_whole(ApiKind kind, const OpenAiRequest& r, const ReplyFormat& reply,
                     const Streams& streams, const ResponseMeta& meta, const httplib::Request& req,
                     httplib::Response& res);
  std::string metrics() const;
};

// Runs a handler body, turning every failure into an OpenAI error response: the server
// itself never sees an exception from a request.
template <typename F>
void guarded(httplib::Response& res, F&& body) {
  try {
    body();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const SchedulerBusy& e) {
    // A full queue is the client's cue to retry later (429); a stopping server is 503.
    res.set_header("Retry-After", "1");
    send_error(res, ApiError(e.stopping() ? 503 : 429, e.message(), "", "",
                             e.stopping() ? "server_stopping" : "queue_full"));
  } catch (const Error& e) {
    send_error(res, ApiError(400, e.message()));
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
  }
}

}  // namespace metrale::http
