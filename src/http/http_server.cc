#include "http/http_server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <httplib.h>

#include "engine/session.h"
#include "http/http_server_impl.h"
#include "http/openai_embeddings.h"
#include "http/sockets.h"
#include "http/worker_api.h"
#include "io/tokenizer/tokenizer.h"

namespace metrale::http {
namespace {

// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace

int find_connection_socket(const httplib::Request& req) {
  return find_connection_socket(req.local_port, req.remote_addr, req.remote_port);
}

std::string HttpServer::Impl::read_body(const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& reader) const {
  // A request with neither Content-Length nor chunked encoding has no body (RFC 9112 6.3);
  // httplib 0.11 would read one until the client closes or the read timeout fires.
  if (!req.has_header("Content-Length") &&
      req.get_header_value("Transfer-Encoding").find("chunked") == std::string::npos) {
    ConnectionGuard::body_done();
    return "";
  }
  // httplib 0.11 enforces its payload limit only on a Content-Length body (413 before reading
  // it); a chunked body would grow without bound, so the receiver stops it here.
  std::string body;
  bool too_big = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (body.size() + n > options.max_body_bytes) {
      too_big = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (too_big || res.status == 413) {
    // What is left of the body is unread: the connection cannot be reused.
    res.set_header("Connection", "close");
    throw ApiError(413,
                   "request body larger than " + std::to_string(options.max_body_bytes) + " bytes",
                   "", "", "payload_too_large");
  }
  if (!ok) throw ApiError(400, "could not read the request body");
  ConnectionGuard::body_done();  // past here the request timeout bounds it, not the guard
  return body;
}

std::string HttpServer::Impl::adapter_of(const std::string& requested) const {
  const bool adapter = std::find(options.adapters.begin(), options.adapters.end(), requested) !=
                       options.adapters.end();
  if (!requested.empty() && requested != model_name && !adapter) {
    std::string served = "`" + model_name + "`";
    for (const std::string& a : options.adapters) served += ", `" + a + "`";
    throw ApiError(
        404, "The model `" + requested + "` does not exist (this server serves " + served + ").",
        "model", "", "model_not_found");
  }
  return adapter ? requested : "";
}

void HttpServer::Impl::embeddings(const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& reader) {
  const std::string body = read_body(req, res, reader);
  // Held until the response is written: drain() waits for it.
  std::shared_ptr<void> admitted = lifecycle.admit();
  if (!admitted) throw refuse_draining(res);
  const EmbeddingsRequest r = parse_embeddings_request(body);
  const std::string adapter = adapter_of(r.model);
  const std::optional<EmbeddingConfig>& config = scheduler.embedding();
  if (!config) {
    throw ApiError(400, "this server does not serve embeddings: " + options.embeddings_unavailable,
                   "", "", "embeddings_unavailable");
  }
  if (r.dimensions > config->dimension) {
    throw ApiError(400,
                   "dimensions " + std::to_string(r.dimensions) + " is more than the model's " +
                       std::to_string(config->dimension) + "-value embedding",
                   "dimensions");
  }
  // Each input's ids: a text with the tokenizer's special tokens, as sentence-transformers
  // encodes it. Every input is checked here so an error can name it.
  std::vector<ServeRequest> requests(r.size());
  const int64_t limit = max_embedding_tokens(model, *config);
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    std::vector<int32_t> ids = r.input_is_ids ? r.ids[i] : tok.encode(r.texts[i], true);
    const std::string where = r.size() == 1 ? "input" : "input[" + std::to_string(i) + "]";
    if (ids.empty()) throw ApiError(400, where + ": the text encodes to no tokens", "input");
    for (const int32_t id : ids) {
      if (id >= model.vocab_size()) {
        throw ApiError(400,
                       where + ": token id " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(model.vocab_size()) +
                           ")",
                       "input");
      }
    }
    if (static_cast<int64_t>(ids.size()) > limit) {
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(limit) +
                         " tokens. However, " + where + " has " + std::to_string(ids.size()) +
                         " tokens. Please reduce the length of the input.",
                     "input", "", "context_length_exceeded");
    }
    prompt_tokens += static_cast<int64_t>(ids.size());
    requests[i].prompt = std::move(ids);
    requests[i].embedding = EmbeddingParams{.dimensions = r.dimensions};
    requests[i].adapter = adapter;
  }
  if (stopping) throw ApiError(503, "the server is stopping", "", "", "server_stopping");
  const Streams streams = scheduler.submit_all(std::move(requests));
  auto cancel_all = [&] {
    for (const auto& st : streams) st->cancel();
  };
  const int fd = find_connection_socket(req);
  std::vector<std::vector<float>> out(streams.size());
  std::vector<bool> done(streams.size(), false);
  size_t n_done = 0, first = 0;  // first: the first input not done (they finish about in order)
  std::vector<ServeEvent> events;
  while (n_done < streams.size()) {
    if (stopping) {
      cancel_all();
      throw ApiError(503, "the server is stopping", "", "", "server_stopping");
    }
    // Wait on the oldest unfinished input; take whatever the others have without waiting.
    for (size_t i = first; i < streams.size(); ++i) {
      if (done[i]) continue;
      events.clear();
      streams[i]->next(events, i == first ? options.poll_interval : std::chrono::milliseconds(0));
      for (ServeEvent& e : events) {
        if (!e.done) continue;
        done[i] = true;
        ++n_done;
        // An input that fails fails the request (counted once, as it fails).
        if (failed(e.finish)) count_finish("embeddings", e.finish);
        switch (e.finish) {
          case FinishReason::kStop:
          case FinishReason::kLength:
            out[i] = std::move(e.embedding);
            break;
          case FinishReason::kTimeout:
            cancel_all();
            throw ApiError(503, "the request timed out", "", "", "timeout");
          case FinishReason::kCancelled:
            cancel_all();
            throw ApiError(503, "the request was cancelled", "", "", "cancelled");
          case FinishReason::kError:
            cancel_all();
            throw ApiError(500, "embedding failed: " + e.error);
        }
      }
    }
    while (first < streams.size() && done[first]) ++first;
    if (n_done < streams.size() && peer_gone(fd)) {
      cancel_all();
      ++client_disconnects;
      res.status = 499;
      return;
    }
  }
  count_finish("embeddings", FinishReason::kStop);
  send_json(res, 200, dump_json(embeddings_json(model_name, out, r.base64, prompt_tokens)));
}

std::string HttpServer::Impl::metrics() const {
  const ConnectionCounts c = guard.counts();
  HttpCounters http{.client_disconnects = client_disconnects.load(),
                    .in_flight = lifecycle.in_flight(),
                    .draining = lifecycle.draining(),
                    .connections_open = c.open,
                    .connections_rejected = c.rejected,
                    .requests_timed_out = c.timed_out};
  {
    std::lock_guard lock(metrics_mu);
    http.responses_by_status = responses_by_status;
    http.finishes = finishes;
  }
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return metrics_text(scheduler.stats(), http, model_name, now);
}

void HttpServer::Impl::setup() {
  server.new_task_queue = [this] { return guard.make_task_queue(); };
  server.set_payload_max_length(options.max_body_bytes);
  server.set_read_timeout(options.read_timeout);
  server.set_write_timeout(options.write_timeout);
  server.set_keep_alive_timeout(options.keep_alive_timeout.count());
  server.set_keep_alive_max_count(static_cast<size_t>(options.keep_alive_max));
  server.set_tcp_nodelay(true);  // SSE events are small and must leave at once
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half the connections; SO_REUSEADDR alone still allows a quick restart.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    ConnectionGuard::head_done();
    if (req.headers.size() > static_cast<size_t>(options.max_headers)) {
      res.set_header("Connection", "close");
      send_json(
          res, 431,
          error_body(431, "too many header fields: at most " + std::to_string(options.max_headers) +
                              ", found " + std::to_string(req.headers.size())));
      return httplib::Server::HandlerResponse::Handled;
    }
    // A request with a body for any path but the POST endpoints is answered before httplib
    // reads that body into memory (it would read a chunked one without limit). The body is
    // left unread, so the connection cannot be reused.
    static const std::array<std::string_view, 8> kPostPaths = {"/v1/chat/completions",
                                                               "/v1/completions",
                                                               "/v1/embeddings",
                                                               "/v1/chat/completions/render",
                                                               "/v1/completions/render",
                                                               "/tokenize",
                                                               "/detokenize",
                                                               "/flush_cache"};
    const bool post_endpoint =
        req.method == "POST" &&
        std::find(kPostPaths.begin(), kPostPaths.end(), req.path) != kPostPaths.end();
    if (req.method != "GET" && req.method != "HEAD" && !post_endpoint) {
      res.set_header("Connection", "close");
      send_json(res, 404, error_body(404, "no such endpoint: " + req.method + " " + req.path));
      return httplib::Server::HandlerResponse::Handled;
    }
    // A Content-Length httplib 0.11 misreads ("-5" waits for a body that never comes) or one
    // past the body limit (a reader handler is called before any check, and would wait for the
    // whole declared body) is answered before the body is read, and the connection closed.
    if (req.has_header("Content-Length")) {
      const std::string length = req.get_header_value("Content-Length");
      const bool digits =
          !length.empty() && length.size() <= 19 &&
          std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits || std::stoull(length) > options.max_body_bytes) {
        res.set_header("Connection", "close");
        send_error(res, digits ? ApiError(413,
                                          "request body larger than " +
                                              std::to_string(options.max_body_bytes) + " bytes",
                                          "", "", "payload_too_large")
                               : ApiError(400,
                                          "Content-Length: expected a decimal byte count, "
                                          "found '" +
                                              length.substr(0, 40) + "'"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // Draining: a generation or embeddings request is refused before its body is read (generate()
    // checks again, for one that was past here when the drain began).
    if (post_endpoint &&
        (req.path == kPostPaths[0] || req.path == kPostPaths[1] || req.path == kPostPaths[2]) &&
        lifecycle.draining()) {
      send_error(res, refuse_draining(res));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options.api_key.empty() || req.path == "/health") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string auth = req.get_header_value("Authorization");
    const std::string_view prefix = "Bearer ";
    if (auth.size() > prefix.size() && auth.compare(0, prefix.size(), prefix) == 0 &&
        same_secret(std::string_view(auth).substr(prefix.size()), options.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.set_header("WWW-Authenticate", "Bearer");
    res.set_header("Connection", "close");  // a POST body, if any, is left unread
    send_error(res, ApiError(401,
                             auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'"
                                          : "invalid API key",
                             "", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Every error status the handlers did not describe (404 for an unknown path, httplib's own
  // 400 / 413 / 414) in OpenAI's shape.
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.status == 499) return;
    const std::string message = res.status == 404
                                    ? "no such endpoint: " + req.method + " " + req.path
                                : res.status == 413 ? "request body too large"
                                                    : "HTTP error " + std::to_string(res.status);
    send_json(res, res.status, error_body(res.status, message));
  });
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_json(res, 500, error_body(500, "internal error: " + what));
      });
  // While draining every response closes its connection, so keep-alive clients (a router's
  // pool) reconnect elsewhere instead of reusing this one.
  server.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    if (lifecycle.draining() && !res.has_header("Connection"))
      res.set_header("Connection", "close");
  });
  server.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    ConnectionGuard::response_done();  // the next request's head clock starts
    std::lock_guard lock(metrics_mu);
    ++responses_by_status[res.status];
  });

  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping) {
      send_json(res, 503, error_body(503, "the server is stopping"));
    } else if (lifecycle.draining()) {
      // A router's health check fails, so it stops sending here.
      res.set_header("Retry-After", std::to_string(lifecycle.retry_after_seconds()));
      send_json(res, 503,
                dump_json({{"status", "draining"},
                           {"requests_in_flight", lifecycle.in_flight()},
                           {"retry_after", lifecycle.retry_after_seconds()}}));
    } else {
      send_json(res, 200, R"({"status":"ok"})");
    }
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  // For routers (http/worker_api.h; docs/deployment.md names who reads what).
  server.Get("/get_load", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, dump_json(load_json(scheduler.stats())));
  });
  for (const char* path : {"/server_info", "/get_server_info"}) {
    server.Get(path, [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, dump_json(server_info_json(scheduler, model_name, options.adapters)));
    });
  }
  for (const char* path : {"/model_info", "/get_model_info"}) {
    server.Get(path, [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, dump_json(model_info_json(model)));
    });
  }
  // sglang's: drops the cached prefixes no request uses (both routers fan it out).
  // A reader route: a POST without a body (what the routers send) is fine; a body is ignored.
  server.Post("/flush_cache", [this](const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
    guarded(res, [&] {
      read_body(req, res, reader);
      const int64_t freed = scheduler.flush_prefix_cache(std::chrono::seconds(30));
      if (freed < 0) throw ApiError(503, "the engine did not get to the flush in time");
      send_json(res, 200, dump_json({{"flushed", true}, {"pages_freed", freed}}));
    });
  });
  server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    nlohmann::json data = nlohmann::json::array();
    // root: the checkpoint, as vLLM lists it (sglang-router reads it as the model's path).
    data.push_back({{"id", model_name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "metrale"},
                    {"root", std::filesystem::absolute(model.dir()).lexically_normal().string()},
                    {"max_model_len", model.context_limit()}});
    for (const std::string& a : options.adapters) {
      data.push_back({{"id", a},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "metrale"},
                      {"parent", model_name},
                      {"max_model_len", model.context_limit()}});
    }
    send_json(res, 200, dump_json(nlohmann::json{{"object", "list"}, {"data", data}}));
  });
  server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                             const httplib::ContentReader& reader) {
    guarded(res, [&] { generate(ApiKind::kChat, req, res, reader); });
  });
  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& reader) {
    guarded(res, [&] { generate(ApiKind::kCompletion, req, res, reader); });
  });
  server.Post("/v1/chat/completions/render",
              [this](const httplib::Request& req, httplib::Response& res,
                     const httplib::ContentReader& reader) {
                guarded(res, [&] { render(ApiKind::kChat, req, res, reader); });
              });
  server.Post("/v1/completions/render", [this](const httplib::Request& req, httplib::Response& res,
                                               const httplib::ContentReader& reader) {
    guarded(res, [&] { render(ApiKind::kCompletion, req, res, reader); });
  });
  server.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res,
                                       const httplib::ContentReader& reader) {
    guarded(res, [&] { embeddings(req, res, reader); });
  });
  server.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& reader) {
    guarded(res, [&] { send_json(res, 200, tokenize_response(read_body(req, res, reader), tok)); });
  });
  server.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res,
                                    const httplib::ContentReader& reader) {
    guarded(res,
            [&] { send_json(res, 200, detokenize_response(read_body(req, res, reader), tok)); });
  });
}

HttpServer::HttpServer(Scheduler& scheduler, std::optional<chat::ChatTemplate> chat_template,
                       HttpServerOptions options) {
  METRALE_CHECK(scheduler.model().tokenizer() != nullptr, scheduler.model().dir().string(),
                ": no tokenizer.json; the server needs one to read prompts and write text");
  METRALE_CHECK(options.threads >= 2, "HttpServer: threads must be >= 2, found ", options.threads);
  METRALE_CHECK(options.max_connections >= options.threads,
                "HttpServer: max_connections must be >= threads (", options.threads, "), found ",
                options.max_connections);
  METRALE_CHECK(options.head_timeout > options.keep_alive_timeout,
                "HttpServer: head_timeout must exceed keep_alive_timeout (",
                options.keep_alive_timeout.count(),
                " s) since it includes the keep-alive wait, "
                "found ",
                options.head_timeout.count(), " s");
  impl_ = std::make_unique<Impl>(scheduler, std::move(chat_template), std::move(options));
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  Impl& m = *impl_;
  if (m.options.port == 0) {
    m.port = m.server.bind_to_any_port(m.options.host);
  } else {
    m.port = m.server.bind_to_port(m.options.host, m.options.port) ? m.options.port : -1;
  }
  METRALE_CHECK(m.port > 0, "cannot listen on ", m.options.host, ":", m.options.port,
                " (address in use, or not an address of this machine)");
  raise_listen_backlog(m.port);
  m.guard.set_port(m.port);
  return m.port;
}

void HttpServer::listen() {
  METRALE_CHECK(impl_->port > 0, "HttpServer::listen: call bind() first");
  impl_->listening = true;
  if (!impl_->stopping) impl_->server.listen_after_bind();
  impl_->listening = false;
}

int64_t HttpServer::drain(std::chrono::milliseconds timeout) {
  const int64_t ended = impl_->lifecycle.drain(timeout, kDrainEndGrace);
  stop();
  return ended;
}

bool HttpServer::draining() const { return impl_->lifecycle.draining(); }
int64_t HttpServer::requests_in_flight() const { return impl_->lifecycle.in_flight(); }

void HttpServer::stop() {
  impl_->stopping = true;
  impl_->lifecycle.stop();
  // httplib's stop() does nothing before its listen loop has started (a signal during the
  // model load, handled before listen() begins): repeat it until listen() has returned.
  while (impl_->listening) {
    impl_->server.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int HttpServer::port() const { return impl_->port; }
const std::string& HttpServer::model_name() const { return impl_->model_name; }
std::string HttpServer::metrics() const { return impl_->metrics(); }

}  // namespace metrale::http
