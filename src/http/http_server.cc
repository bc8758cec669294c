#include "http/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

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
#include "http/connection_guard.h"
#include "http/lifecycle.h"
#include "http/openai_api.h"
#include "http/openai_embeddings.h"
#include "http/worker_api.h"
#include "io/tokenizer/tokenizer.h"
#include "vision/decode.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/video.h"

namespace metrale::http {
namespace {

constexpr const char* kJson = "application/json";

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_json(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, kJson);
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status(), dump_json(e.to_json()));
}

// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

// The address and port of a socket end, printed as httplib prints req.remote_addr.
bool socket_end(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  std::array<char, NI_MAXHOST> host{};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host.data(), host.size(), nullptr,
                  0, NI_NUMERICHOST) != 0) {
    return false;
  }
  ip = host.data();
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return false;
  }
  return true;
}

// Calls fn(fd) for each socket of this process (from /proc/self/fd, Linux) until it returns
// true; returns that fd, or -1.
template <typename F>
int find_socket(F&& fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    if (fn(static_cast<int>(fd))) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// The socket of the connection a handler serves. cpp-httplib 0.11 gives a handler no access
// to it (Request carries only the two ends' addresses, and the only hook on accepted sockets
// is a private virtual), yet a non-streaming request must notice a client that hung up while
// it waited, or a dead client's sequence would decode to max_tokens. A TCP connection is the
// one socket of this process with its (local port, peer address, peer port), so the handler
// finds it among /proc/self/fd (microseconds for the few hundred descriptors a server holds),
// once per request. The connection thread owns the socket until the handler returns, so the
// descriptor cannot be closed or reused meanwhile. -1 when not found (the request is then
// only bounded by its timeout).
int find_connection_socket(const httplib::Request& req) {
  return find_socket([&](int fd) {
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
      return false;  // not a socket, or not a connected one
    }
    std::string local_ip, peer_ip;
    int local_port = -1, peer_port = -1;
    return socket_end(local, local_len, local_ip, local_port) &&
           socket_end(peer, peer_len, peer_ip, peer_port) && local_port == req.local_port &&
           peer_port == req.remote_port && peer_ip == req.remote_addr;
  });
}

// Debian's libcpp-httplib 0.11 is built with a listen backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG
// is compiled into the library, so defining it here changes nothing): 32 clients connecting at
// once would see dropped SYNs and second-long retries. Linux lets listen() be called again on a
// listening socket to change its backlog, so the server finds its socket and raises it.
void raise_listen_backlog(int port) {
  find_socket([&](int fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    sockaddr_storage local{};
    socklen_t local_len = sizeof local;
    std::string ip;
    int local_port = -1;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        !socket_end(local, local_len, ip, local_port) || local_port != port) {
      return false;
    }
    ::listen(fd, SOMAXCONN);
    return true;
  });
}

// Whether the peer closed or reset the connection: HTTP clients do not half-close while
// awaiting a response, so a FIN (POLLRDHUP) means it went away.
// A choice that ended without its text (cancelled, timed out, failed) fails its request.
bool failed(FinishReason r) { return r != FinishReason::kStop && r != FinishReason::kLength; }

// How long a handler waits on each of a request's n streams per round: a share of the
// poll interval, so the client is still checked every poll_interval.
std::chrono::milliseconds wait_per_stream(std::chrono::milliseconds poll_interval, size_t n) {
  return std::max(std::chrono::milliseconds(1), poll_interval / static_cast<int64_t>(n));
}

bool peer_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

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

std::vector<int32_t> HttpServer::Impl::encode_prompt(const OpenAiRequest& r,
                                                     std::string& rendered) const {
  if (r.kind == ApiKind::kCompletion) {
    if (r.prompt_is_ids) return r.prompt_ids;
    // A text prompt gets the tokenizer's special tokens (bos), as `metrale generate`,
    // vLLM and llama-server encode a completion prompt.
    return tok.encode(r.prompt_text, /*add_special_tokens=*/true);
  }
  if (!chat_template) {
    throw ApiError(400,
                   "this model has no chat template (neither chat_template.jinja nor "
                   "tokenizer_config.json's chat_template): start the server with "
                   "--chat-template FILE, or use /v1/completions",
                   "messages", "", "no_chat_template");
  }
  try {
    rendered = chat_template->render(r.chat);
  } catch (const Error& e) {
    throw ApiError(400, "chat template: " + e.message(), "messages");
  }
  // The rendered text already holds every special token the template wants (bos included):
  // encode it without adding more, as transformers' apply_chat_template(tokenize=True) and
  // vLLM do (llama-server gets the same ids by dropping a leading bos from the rendered text
  // and letting the tokenizer add it).
  return tok.encode(rendered, /*add_special_tokens=*/false);
}

std::vector<vision::VisionItem> HttpServer::Impl::load_media(const OpenAiRequest& r,
                                                             std::vector<int32_t>& prompt) const {
  std::vector<vision::VisionItem> items;
  if (r.media.empty()) return items;
  const MediaOptions& o = options.media;
  const VisionEncoder* vision = model.vision();
  if (static_cast<int64_t>(r.media.size()) > o.max_items) {
    const std::string& where = r.media[static_cast<size_t>(o.max_items)].where;
    throw ApiError(400,
                   where + ": " + std::to_string(r.media.size()) +
                       " images and videos in the request; at most " + std::to_string(o.max_items) +
                       " are accepted (--max-media-items)",
                   where);
  }
  for (const MediaPart& part : r.media) {
    const std::vector<uint8_t> bytes = read_media_part(part, o);
    try {
      vision::DecodeLimits limits;
      limits.max_pixels = o.max_image_pixels;
      if (part.kind == vision::VisionKind::kImage) {
        const vision::Image image = vision::decode_image(bytes, limits);
        items.push_back(
            vision::preprocess_image(image, vision::load_image_processor_config(model.dir())));
        continue;
      }
      vision::VideoOptions vo;
      vo.limits = limits;
      vo.max_frames = static_cast<size_t>(o.max_video_frames);
      const vision::VideoInfo info = vision::probe_video(bytes, vo);
      METRALE_CHECK(info.total_frames <= o.max_video_frames, "the video has ", info.total_frames,
                    " frames; at most ", o.max_video_frames, " are accepted (--max-video-frames)");
      const double fps = info.fps > 0 ? info.fps : 24.0;  // HF's default when unknown
      const double seconds = static_cast<double>(info.total_frames) / fps;
      METRALE_CHECK(seconds <= o.max_video_seconds, "the video lasts ", seconds, " s; at most ",
                    o.max_video_seconds, " s are accepted (--max-video-seconds)");
      const vision::VideoFrames frames = vision::decode_video(bytes, vo);
      METRALE_CHECK(!frames.frames.empty(), "the video decoded to no frames");
      items.push_back(vision::preprocess_video(frames.frames, frames.fps > 0 ? frames.fps : 24.0,
                                               vision::load_video_processor_config(model.dir())));
    } catch (const ApiError&) {
      throw;
    } catch (const Error& e) {
      throw ApiError(400, part.where + ": " + e.message(), part.where);
    }
  }
  try {
    prompt = place_media(vision->config(), prompt, items,
                         static_cast<int32_t>(model.config().bos_token_id.value_or(-1)),
                         model.tokenizer());
  } catch (const Error& e) {
    throw ApiError(400, "messages: " + e.message(), "messages");
  }
  return items;
}

std::shared_ptr<const CompiledGrammar> HttpServer::Impl::compile_grammar(const GrammarSpec& spec) {
  if (!grammar_available()) {
    throw ApiError(400,
                   "field '" + spec.field +
                       "': structured outputs are unavailable: this server was built without "
                       "xgrammar (scripts/fetch-xgrammar.sh)",
                   spec.field, "", "unsupported_parameter");
  }
  size_t bytes = spec.text.size() + spec.prefix.size() + spec.suffix.size();
  for (const std::string& c : spec.choices) bytes += c.size();
  if (bytes > options.max_grammar_bytes) {
    throw ApiError(400,
                   "field '" + spec.field + "': the grammar is " + std::to_string(bytes) +
                       " bytes; this server takes at most " +
                       std::to_string(options.max_grammar_bytes) + " (--max-grammar-bytes)",
                   spec.field);
  }
  std::call_once(grammar_once, [&] {
    grammar_compiler =
        std::make_unique<GrammarCompiler>(tok, model.vocab_size(), default_eos_ids(model));
  });
  try {
    return grammar_compiler->compile(spec);
  } catch (const Error& e) {
    throw ApiError(400, e.message(), spec.field);
  }
}

std::shared_ptr<ServeStream> HttpServer::Impl::submit(ServeRequest request) const {
  if (stopping) throw ApiError(503, "the server is stopping", "", "", "server_stopping");
  return scheduler.submit(std::move(request));
}

void HttpServer::Impl::generate(ApiKind kind, const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) {
  const std::string body = read_body(req, res, reader);
  // Held until the response is written (a stream's state keeps it): drain() waits for it.
  std::shared_ptr<void> admitted = lifecycle.admit();
  if (!admitted) throw refuse_draining(res);
  const OpenAiRequest r =
      kind == ApiKind::kChat ? parse_chat_request(body) : parse_completion_request(body);
  const std::string adapter = adapter_of(r.model);
  // Media to a text-only model: refused before the template sees them.
  if (!r.media.empty() && model.vision() == nullptr) {
    throw ApiError(400,
                   r.media.front().where + ": this model (model_type \"" +
                       model.config().model_type +
                       "\") has no vision tower metrale runs, so it "
                       "takes no images or videos",
                   r.media.front().where);
  }
  std::string rendered;
  std::vector<int32_t> prompt = encode_prompt(r, rendered);
  std::vector<vision::VisionItem> media = load_media(r, prompt);
  ReplyFormat reply;
  if (kind == ApiKind::kChat) {
    reply.reasoning = options.reasoning_format;
    reply.reasoning_starts_open = chat::prompt_opens_reasoning(rendered);
    reply.include_reasoning = r.include_reasoning;
    if (r.wants_tool_calls) reply.tool_calls = options.tool_call_format;
    reply.tools = r.tools;
  }
  ServeRequest s = to_serve_request(r, std::move(prompt), model.context_limit(), model.vocab_size(),
                                    reply.tool_calls);
  s.adapter = adapter;
  s.media = std::move(media);
  if (r.forced_tool) {
    s.grammar =
        compile_grammar(forced_tool_call_grammar(r.tools, *r.forced_tool, reply.tool_calls));
  } else if (r.grammar) {
    s.grammar = compile_grammar(*r.grammar);
  }
  Streams streams;
  try {
    for (ServeRequest& choice : choice_requests(r, std::move(s))) {
      streams.push_back(submit(std::move(choice)));
    }
  } catch (...) {
    for (const auto& st : streams) st->cancel();  // all the choices or none
    throw;
  }
  ResponseMeta meta{
      (kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + std::to_string(streams.front()->id()),
      unix_now(), adapter.empty() ? model_name : r.model};  // vLLM echoes the adapter's name
  if (r.stream) {
    respond_streaming(kind, r, reply, std::move(streams), std::move(meta), std::move(admitted),
                      res);
  } else {
    respond_whole(kind, r, reply, streams, meta, req, res);
  }
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

void HttpServer::Impl::respond_whole(ApiKind kind, const OpenAiRequest& r, const ReplyFormat& reply,
                                     const Streams& streams, const ResponseMeta& meta,
                                     const httplib::Request& req, httplib::Response& res) {
  const int fd = find_connection_socket(req);
  std::vector<Collected> choices(streams.size());
  auto cancel_all = [&] {
    for (const auto& st : streams) st->cancel();
  };
  std::vector<ServeEvent> events;
  // The client is checked every poll_interval, whether tokens are flowing or not: a request
  // decoding steadily must notice a hang-up as soon as a waiting one.
  auto next_check = std::chrono::steady_clock::now() + options.poll_interval;
  const auto wait = wait_per_stream(options.poll_interval, streams.size());
  auto all_done = [&] {
    return std::all_of(choices.begin(), choices.end(), [](const Collected& c) { return c.done; });
  };
  while (!all_done()) {
    if (stopping) {
      cancel_all();
      throw ApiError(503, "the server is stopping", "", "", "server_stopping");
    }
    if (lifecycle.ending()) {  // the drain's time is up
      cancel_all();
      res.set_header("Retry-After", "1");
      res.set_header("Connection", "close");
      throw ApiError(503, "the server shut down before the request finished; retry it", "", "",
                     "server_shutting_down");
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      if (choices[i].done) continue;
      events.clear();
      streams[i]->next(events, wait);
      for (ServeEvent& e : events) choices[i].add(e);
      // A choice that failed fails the request: the others need not run on.
      if (choices[i].done && failed(choices[i].finish)) cancel_all();
    }
    if (all_done()) break;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check) continue;
    next_check = now + options.poll_interval;
    if (peer_gone(fd)) {
      // Nobody will read the answer: free the sequences now. 499 ("client closed request",
      // nginx's code) only shows in the logs and /metrics.
      cancel_all();
      ++client_disconnects;
      res.status = 499;
      return;
    }
  }
  const char* endpoint = kind == ApiKind::kChat ? "chat" : "completions";
  for (const Collected& choice : choices) count_finish(endpoint, choice.finish);
  // The request fails as its first failing choice does.
  const auto first_failed = std::find_if(choices.begin(), choices.end(),
                                         [](const Collected& x) { return failed(x.finish); });
  const Collected& c = first_failed != choices.end() ? *first_failed : choices.front();
  switch (c.finish) {
    case FinishReason::kStop:
    case FinishReason::kLength: {
      const bool logprobs = r.top_logprobs >= 0;
      send_json(res, 200,
                dump_json(kind == ApiKind::kChat
                              ? chat_completion_json(meta, choices, logprobs, tok, reply)
                              : text_completion_json(meta, choices, logprobs, tok)));
      return;
    }
    case FinishReason::kTimeout:
      throw ApiError(503,
                     "the request timed out after generating " +
                         std::to_string(c.usage.completion_tokens) + " tokens",
                     "", "", "timeout");
    case FinishReason::kCancelled:
      throw ApiError(503, "the request was cancelled", "", "", "cancelled");
    case FinishReason::kError:
      throw ApiError(500, "generation failed: " + c.error);
  }
}

void HttpServer::Impl::respond_streaming(ApiKind kind, const OpenAiRequest& r,
                                         const ReplyFormat& reply, Streams streams,
                                         ResponseMeta meta, std::shared_ptr<void> admitted,
                                         httplib::Response& res) {
  // The provider runs on this connection's thread after the handler returns, once per chunk,
  // until sink.done(). Whatever ends it early (a failed write, a dead socket, the server
  // stopping) leaves `finished` false, and the releaser cancels the streams.
  struct State {
    Streams streams;  // one per choice
    SseEncoder encoder;
    std::vector<bool> done;  // the choice's last event was read
    std::vector<ServeEvent> events;
    bool finished = false;
    std::chrono::steady_clock::time_point next_check;
    std::shared_ptr<void> admitted;  // the Lifecycle token: released with the state
    void cancel_all() const {
      for (const auto& st : streams) st->cancel();
    }
  };
  const auto n = static_cast<int>(streams.size());
  auto state = std::make_shared<State>(
      State{std::move(streams),
            SseEncoder(kind, std::move(meta), r.top_logprobs >= 0, r.include_usage, tok, reply, n),
            std::vector<bool>(static_cast<size_t>(n), false),
            {},
            false,
            std::chrono::steady_clock::now() + options.poll_interval,
            std::move(admitted)});
  const char* endpoint = kind == ApiKind::kChat ? "chat" : "completions";
  // With several choices each is polled in turn for a share of the interval.
  const auto wait = wait_per_stream(options.poll_interval, static_cast<size_t>(n));
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies must not hold events back
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state, endpoint, wait](size_t /*offset*/, httplib::DataSink& sink) {
        if (lifecycle.ending()) {
          // The drain's time is up: the stream ends cleanly (an error event the OpenAI SDKs
          // raise, then [DONE]) rather than with a cut connection.
          state->cancel_all();
          const std::string last = state->encoder.fail(
              503, "the server shut down before the stream finished", "server_shutting_down");
          state->finished = true;
          if (!last.empty() && !sink.write(last.data(), last.size())) return false;
          sink.done();
          return true;
        }
        std::string out;
        bool got = false;
        for (size_t i = 0; i < state->streams.size(); ++i) {
          if (state->done[i]) continue;
          state->events.clear();
          if (!state->streams[i]->next(state->events, wait)) continue;
          got = true;
          for (const ServeEvent& e : state->events) {
            out += state->encoder.encode(e, static_cast<int>(i));
            if (e.done) {
              state->done[i] = true;
              count_finish(endpoint, e.finish);
              // A choice that failed ends the stream: the others need not run on.
              if (failed(e.finish)) state->cancel_all();
            }
          }
        }
        // Is anyone still listening? Checked every poll_interval (a write to a closed
        // connection fails too, but only once text is written: a queued request, a long
        // prefill or text held back by a stop string writes nothing). is_writable() also
        // peeks the socket, so a closed connection shows here.
        const auto now = std::chrono::steady_clock::now();
        if (!got || now >= state->next_check) {
          state->next_check = now + options.poll_interval;
          if (stopping || !sink.is_writable()) {
            if (!stopping) ++client_disconnects;
            state->cancel_all();
            return false;
          }
        }
        if (!got) return true;
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          ++client_disconnects;
          state->cancel_all();
          return false;
        }
        if (state->encoder.finished()) {
          state->finished = true;
          sink.done();
        }
        return true;
      },
      [state](bool /*success*/) {
        if (!state->finished) state->cancel_all();
      });
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
    static const std::array<std::string_view, 6> kPostPaths = {
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize",
        "/detokenize",          "/flush_cache"};
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
