// The HTTP server in-process on an ephemeral port, over the demo model and a real Scheduler,
// driven with httplib::Client: authentication, OpenAI-shaped errors (404, 413 by
// Content-Length and chunked, malformed JSON, wrong types), /tokenize round trips, a
// completion equal to the same prompt run alone, SSE streaming, and a client vanishing
// mid-request cancelling its stream.
#include "http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "engine/session.h"
#include "http/openai_api.h"
#include "http/openai_embeddings.h"
#include "lora/lora_pool.h"
#include "speculative/ngram_proposer.h"

namespace metrale::http {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kKey = "sk-test-key";

std::unique_ptr<Model> load_demo() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 1024;
  o.max_rows = 64;
  return Model::load("models/demo", o);
}

// A server on a free port, with a tiny chat template, serving until destroyed.
class ServerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load_demo();
    HttpServerOptions o;
    o.port = 0;
    o.read_timeout = 1s;
    o.api_key = kKey;
    o.model_name = "demo";
    o.max_body_bytes = 64 << 10;
    o.threads = 16;
    prepare(*model_, o);
    scheduler_ = std::make_unique<Scheduler>(*model_, scheduler_options());
    server_ = std::make_unique<HttpServer>(
        *scheduler_,
        chat::ChatTemplate::from_string(
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}",
            "test-template"),
        o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_bearer_token_auth(kKey);
    client_->set_read_timeout(30, 0);
    // Wait until the accept loop runs.
    for (int i = 0; i < 100 && !client_->Get("/health"); ++i) std::this_thread::sleep_for(10ms);
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }

  virtual SchedulerOptions scheduler_options() const { return {.max_seqs = 4}; }
  // Before the scheduler starts: what a variant loads into the model or sets on the server.
  virtual void prepare(Model&, HttpServerOptions&) {}

  httplib::Result post(const std::string& path, const std::string& body) {
    return client_->Post(path.c_str(), body, "application/json");
  }
  static json error_of(const httplib::Result& r) { return json::parse(r->body)["error"]; }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(ServerFixture, HealthNeedsNoKeyEverythingElseDoes) {
  httplib::Client anon("127.0.0.1", port_);
  auto h = anon.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");

  for (const char* path : {"/v1/models", "/metrics"}) {
    auto r = anon.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(error_of(r)["type"], "authentication_error");
  }
  auto post_anon = anon.Post("/v1/completions", R"({"prompt": "x"})", "application/json");
  ASSERT_TRUE(post_anon);
  EXPECT_EQ(post_anon->status, 401);
  httplib::Client wrong("127.0.0.1", port_);
  wrong.set_bearer_token_auth("sk-test-kez");
  auto w = wrong.Get("/v1/models");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->status, 401);
  EXPECT_EQ(error_of(w)["code"], "invalid_api_key");

  auto m = client_->Get("/v1/models");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  const json models = json::parse(m->body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "demo");
  EXPECT_EQ(models["data"][0]["object"], "model");
}

TEST_F(ServerFixture, APortInUseIsAnError) {
  HttpServerOptions o;
  o.port = port_;
  HttpServer second(*scheduler_, std::nullopt, o);
  EXPECT_THROW(second.bind(), Error);
}

// A stop before the accept loop starts (a signal during start-up) still ends listen(); a
// lost stop would leave the process serving 503s forever.
TEST_F(ServerFixture, AStopBeforeOrAsListenStartsEndsIt) {
  HttpServerOptions o;
  o.port = 0;
  o.threads = 2;
  {
    HttpServer early(*scheduler_, std::nullopt, o);
    early.bind();
    early.stop();
    early.listen();  // returns at once
  }
  for (int i = 0; i < 20; ++i) {
    HttpServer racing(*scheduler_, std::nullopt, o);
    racing.bind();
    std::thread t([&] { racing.listen(); });
    if (i % 2 == 1) std::this_thread::sleep_for(1ms);
    racing.stop();
    t.join();
  }
}

TEST_F(ServerFixture, UnknownPathsAndModelsAre404) {
  auto r = client_->Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(error_of(r)["type"], "not_found_error");
  // Bodies sent anywhere else are refused unread (a chunked one is not buffered).
  auto put = client_->Put("/v1/completions", R"({"prompt": "x"})", "application/json");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 404);
  httplib::Client c("127.0.0.1", port_);
  c.set_bearer_token_auth(kKey);
  auto chunked = c.Post(
      "/v1/elsewhere",
      [](size_t offset, httplib::DataSink& sink) {
        if (offset >= (size_t{1} << 20)) {
          sink.done();
          return true;
        }
        const std::string block(4096, ' ');
        return sink.write(block.data(), block.size());
      },
      "application/json");
  if (chunked) {
    EXPECT_EQ(chunked->status, 404);
  }
  auto m = post("/v1/completions", R"({"model": "gpt-9", "prompt": "x"})");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 404);
  EXPECT_EQ(error_of(m)["code"], "model_not_found");
}

TEST_F(ServerFixture, OversizedBodiesAre413) {
  const std::string big = R"({"prompt": ")" + std::string(100 << 10, 'a') + R"("})";
  auto r = post("/v1/completions", big);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(error_of(r)["type"], "invalid_request_error");
  // Chunked transfer has no Content-Length for httplib to check: the server counts.
  httplib::Client c("127.0.0.1", port_);
  c.set_bearer_token_auth(kKey);
  auto chunked = c.Post(
      "/v1/completions",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset >= big.size()) {
          sink.done();
          return true;
        }
        const size_t n = std::min<size_t>(4096, big.size() - offset);
        return sink.write(big.data() + offset, n);
      },
      "application/json");
  // The server answers 413 as soon as the limit passes, while the client is still sending: a
  // client that does not read meanwhile may see the connection reset instead.
  if (chunked) {
    EXPECT_EQ(chunked->status, 413);
  }
  // The server is still fine.
  auto h = client_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST_F(ServerFixture, BadBodiesAre400InOpenAisShape) {
  const std::pair<const char*, std::string> cases[] = {
      {"/v1/completions", "{not json"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": "many"})"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 5000})"},  // past the context
      {"/v1/completions", R"({"prompt": [999999]})"},                 // id past the vocabulary
      {"/v1/chat/completions", R"({"messages": "hi"})"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "n": 17})"},
      {"/tokenize", R"({"content": 1})"},
      {"/detokenize", R"({"tokens": [99999]})"},
  };
  for (const auto& [path, body] : cases) {
    auto r = post(path, body);
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, 400) << path << " " << body << " -> " << r->body;
    const json e = error_of(r);
    EXPECT_EQ(e["type"], "invalid_request_error") << body;
    EXPECT_TRUE(e["message"].is_string()) << body;
  }
}

TEST_F(ServerFixture, TokenizeRoundTrip) {
  auto t = post("/tokenize", R"({"content": "In the beginning God created"})");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200);
  const json ids = json::parse(t->body)["tokens"];
  EXPECT_EQ(ids.get<std::vector<int32_t>>(),
            model_->tokenizer()->encode("In the beginning God created", false));
  auto d = post("/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_TRUE(d);
  ASSERT_EQ(d->status, 200);
  EXPECT_EQ(json::parse(d->body)["content"], "In the beginning God created");
}

TEST_F(ServerFixture, CompletionEqualsThePromptRunAlone) {
  auto r =
      post("/v1/completions",
           R"({"model": "demo", "prompt": "And God said", "max_tokens": 12, "temperature": 0})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);

  std::unique_ptr<Model> alone = load_demo();
  Session session(*alone);
  GenerateOptions g;
  g.max_new_tokens = 12;
  const GenerateResult want = session.generate(alone->tokenizer()->encode("And God said", true), g);
  EXPECT_EQ(j["choices"][0]["text"], want.text);
  EXPECT_EQ(j["usage"]["completion_tokens"], static_cast<int64_t>(want.tokens.size()));
  EXPECT_EQ(j["usage"]["prompt_tokens"], want.prompt_tokens);
  EXPECT_EQ(j["choices"][0]["finish_reason"],
            want.stop == StopReason::kMaxTokens ? "length" : "stop");
}

// vLLM's Renderer API, which vllm-router's cache_aware policy calls on a worker to route by
// prompt tokens: the ids are exactly the prompt the generation endpoint prefills.
TEST_F(ServerFixture, RenderGivesThePromptTheGenerationPrefills) {
  auto c = post("/v1/completions/render",
                R"({"model": "demo", "prompt": "And God said", "max_tokens": 7, "seed": 3,
                    "stop": ["\n"], "temperature": 0.5})");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  const json list = json::parse(c->body);
  ASSERT_TRUE(list.is_array());
  ASSERT_EQ(list.size(), 1u);
  const json& g = list[0];
  EXPECT_EQ(g["token_ids"].get<std::vector<int32_t>>(),
            model_->tokenizer()->encode("And God said", true));
  EXPECT_EQ(g["model"], "demo");
  EXPECT_EQ(g["request_id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(g["sampling_params"]["max_tokens"], 7);
  EXPECT_EQ(g["sampling_params"]["seed"], 3);
  EXPECT_EQ(g["sampling_params"]["stop"], json::array({"\n"}));
  EXPECT_FLOAT_EQ(g["sampling_params"]["temperature"].get<float>(), 0.5f);

  const std::string chat =
      R"({"model": "demo", "max_tokens": 4, "temperature": 0, "messages": [
            {"role": "system", "content": "Thou art a scribe."},
            {"role": "user", "content": "In the beginning"}]})";
  auto r = post("/v1/chat/completions/render", chat);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json one = json::parse(r->body);
  ASSERT_TRUE(one.is_object());  // one GenerateRequest, as vLLM's chat render answers
  EXPECT_EQ(one["request_id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(one["token_ids"].get<std::vector<int32_t>>(),
            model_->tokenizer()->encode(
                "system: Thou art a scribe.\nuser: In the beginning\nassistant:", false));
  auto gen = post("/v1/chat/completions", chat);
  ASSERT_TRUE(gen);
  ASSERT_EQ(gen->status, 200) << gen->body;
  EXPECT_EQ(json::parse(gen->body)["usage"]["prompt_tokens"], one["token_ids"].size());

  // Refused as the generation endpoint refuses: a bad field is 400 naming it, an unknown
  // model 404; nothing is generated either way.
  auto bad = post("/v1/chat/completions/render",
                  R"({"model": "demo", "messages": [{"role": "user", "content": "x"}],
                      "temperature": "hot"})");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "temperature");
  auto unknown = post("/v1/completions/render", R"({"model": "nope", "prompt": "x"})");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  // Only the one chat completion ran: once its end is published, one request finished.
  for (int i = 0; i < 200 && scheduler_->stats().requests_finished < 1; ++i)
    std::this_thread::sleep_for(10ms);
  const SchedulerStats s = scheduler_->stats();
  EXPECT_EQ(s.requests_finished, 1);
  EXPECT_EQ(s.running + s.waiting, 0);
  EXPECT_EQ(s.generated_tokens, 4);
}

TEST_F(ServerFixture, ChatStreamsSseChunks) {
  std::string body;
  httplib::Headers headers = {{"Authorization", std::string("Bearer ") + kKey}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.headers = headers;
  req.body = R"({"messages": [{"role": "user", "content": "Who spake?"}], "max_tokens": 8,
                 "temperature": 0, "stream": true, "stream_options": {"include_usage": true}})";
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    body.append(data, n);
    return true;
  };
  auto r = client_->send(req);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  ASSERT_GE(body.size(), 20u);
  EXPECT_EQ(body.rfind("data: [DONE]\n\n"), body.size() - 14) << body;
  EXPECT_NE(body.find("\"role\":\"assistant\""), std::string::npos);
  EXPECT_NE(body.find("\"finish_reason\":\"length\""), std::string::npos) << body;
  EXPECT_NE(body.find("\"completion_tokens\":8"), std::string::npos) << body;
}

// A raw connection to the server.
int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// Waits up to 10 s for the scheduler to count a cancelled request.
bool saw_cancel(const Scheduler& s, int64_t before) {
  for (int i = 0; i < 1000; ++i) {
    if (s.stats().requests_cancelled > before) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST_F(ServerFixture, AStreamingClientThatLeavesCancelsItsStream) {
  const int64_t before = scheduler_->stats().requests_cancelled;
  httplib::Client c("127.0.0.1", port_);
  c.set_bearer_token_auth(kKey);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Authorization", std::string("Bearer ") + kKey}};
  req.body = R"({"prompt": "And", "max_tokens": 1000, "ignore_eos": true, "stream": true})";
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return ++chunks < 2;  // read a little, then hang up
  };
  c.send(req);
  EXPECT_TRUE(saw_cancel(*scheduler_, before));
}

TEST_F(ServerFixture, ASlowClientIsDroppedAndOthersAreServed) {
  const int fd = connect_to(port_);
  const std::string partial = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                              std::string(kKey) + "\r\nContent-Length: 100\r\n\r\n{\"pro";
  ASSERT_EQ(write(fd, partial.data(), partial.size()), static_cast<ssize_t>(partial.size()));
  // Meanwhile the server answers others.
  auto h = client_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  // After the read timeout (1 s here) the server gives up on the body: 400.
  std::string reply;
  char buf[4096];
  for (ssize_t n;
       reply.find("\r\n\r\n") == std::string::npos && (n = read(fd, buf, sizeof buf)) > 0;) {
    reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
}

TEST_F(ServerFixture, MetricsInPrometheusText) {
  post("/v1/completions", R"({"prompt": "And", "max_tokens": 2})");
  auto r = client_->Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  for (const char* name :
       {"# TYPE metrale_requests_running gauge", "metrale_generated_tokens_total ",
        "metrale_kv_pages_free ", "metrale_prefix_cache_hits_total ",
        "metrale_prefix_cache_bytes_held ", "metrale_steps_total ",
        "metrale_http_requests_finished_total{endpoint=\"completions\",finish_reason=\"length\"} 1",
        "metrale_http_responses_total{code=\"200\"}"}) {
    EXPECT_NE(r->body.find(name), std::string::npos) << name << "\n" << r->body;
  }
}

// The connection guard (http/connection_guard.h) and the pre-routing checks: the limits that
// bound a bad client (docs/reliability.md).
class GuardedServer : public ServerFixture {
  void prepare(Model&, HttpServerOptions& o) override {
    o.read_timeout = 30s;  // a dribbler is never silent long enough for httplib's own timeout
    o.keep_alive_timeout = 1s;
    o.head_timeout = 2s;
    o.body_timeout = 1s;
    o.threads = 4;
    o.max_connections = 6;
    o.max_headers = 20;
  }

 protected:
  // Sends `prefix`, then `tail` a byte per 200 ms; returns whether the server ended the
  // connection before the tail was all sent (a write fails, or a read sees its answer or EOF).
  bool cut_while_dribbling(const std::string& prefix, const std::string& tail) {
    const int fd = connect_to(port_);
    EXPECT_EQ(write(fd, prefix.data(), prefix.size()), static_cast<ssize_t>(prefix.size()));
    bool cut = false;
    for (char c : tail) {
      std::this_thread::sleep_for(200ms);
      pollfd p{fd, POLLIN | POLLRDHUP, 0};
      if (poll(&p, 1, 0) > 0 || send(fd, &c, 1, MSG_NOSIGNAL) != 1) {
        cut = true;
        break;
      }
    }
    close(fd);
    return cut;
  }
  int64_t metric(const std::string& name) {
    auto r = client_->Get("/metrics");
    EXPECT_TRUE(r);
    const size_t at = r->body.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stoll(r->body.substr(at + name.size() + 2));
  }
};

TEST_F(GuardedServer, ABodyDribbledPastItsDeadlineIsCut) {
  const std::string body =
      R"({"prompt": "And", "max_tokens": 2, "padding": ")" + std::string(100, 'x') + "\"}";
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                           std::string(kKey) +
                           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  EXPECT_TRUE(cut_while_dribbling(head, body));  // 100+ bytes: 20 s of dribble, cut at ~1 s
  EXPECT_EQ(metric("metrale_http_requests_timed_out_total"), 1);
}

TEST_F(GuardedServer, AHeadDribbledPastItsDeadlineIsCut) {
  EXPECT_TRUE(cut_while_dribbling("GET /health HTTP/1.1\r\n", "X-Slow: " + std::string(100, 'y')));
  EXPECT_EQ(metric("metrale_http_requests_timed_out_total"), 1);
}

TEST_F(GuardedServer, ConnectionsPastTheLimitGet503) {
  // Seven idle connections against a limit of six: the last accepted reads a 503 and is closed
  // (the others are closed at the keep-alive timeout). Which one is last is the kernel's order,
  // and a connection of SetUp may still be counted, so every reply is read.
  std::vector<int> fds;
  for (int i = 0; i < 7; ++i) fds.push_back(connect_to(port_));
  std::string refused;
  for (int fd : fds) {
    std::string reply;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
      reply.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    if (!reply.empty()) refused = reply;
  }
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused;
  EXPECT_NE(refused.find("too_many_connections"), std::string::npos) << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  EXPECT_GE(metric("metrale_http_connections_rejected_total"), 1);
}

TEST_F(GuardedServer, TooManyHeadersAre431) {
  httplib::Headers h;
  for (int i = 0; i < 30; ++i) h.emplace("X-H" + std::to_string(i), "v");
  auto r = client_->Get("/health", h);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 431);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("at most 20, found"), std::string::npos);
}

// httplib 0.11 reads "-5" as a body it waits for, and hands a reader handler a declared length
// past the limit unchecked: both are answered before any body is read.
TEST_F(GuardedServer, ABadOrOversizedContentLengthIsAnsweredAtOnce) {
  for (const auto& [length, status] :
       std::vector<std::pair<std::string, int>>{{"-5", 400}, {"abc", 400}, {"99999999999", 413}}) {
    const int fd = connect_to(port_);
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                            std::string(kKey) + "\r\nContent-Length: " + length + "\r\n\r\n";
    ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    std::string reply;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) reply.append(buf, static_cast<size_t>(n));
    close(fd);
    EXPECT_EQ(reply.rfind("HTTP/1.1 " + std::to_string(status), 0), 0u) << length << reply;
    if (status == 400) {
      EXPECT_NE(reply.find("Content-Length: expected"), std::string::npos) << reply;
    }
  }
}

// `metrale serve --speculative ngram`: replies equal the same request without drafts, the
// usage counts a speculative request's accepted and rejected drafts, and /metrics has the
// totals and the per-request acceptance histogram.
class SpeculativeServer : public ServerFixture {
 protected:
  SchedulerOptions scheduler_options() const override {
    return {.max_seqs = 4,
            .speculation = {.proposer = std::make_shared<speculative::NgramProposer>()}};
  }
};

TEST_F(SpeculativeServer, UsageAndMetricsCountTheDrafts) {
  const std::string body =
      R"({"prompt": "And God said, I am the LORD. And God said, I am the LORD. And God said",
          "max_tokens": 40, "temperature": 0, "ignore_eos": true)";
  auto on = post("/v1/completions", body + "}");
  auto off = post("/v1/completions", body + R"(, "speculative": false})");
  ASSERT_TRUE(on && off);
  ASSERT_EQ(on->status, 200) << on->body;
  ASSERT_EQ(off->status, 200) << off->body;
  const json a = json::parse(on->body), b = json::parse(off->body);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  const json& details = a["usage"]["completion_tokens_details"];
  EXPECT_GT(details["accepted_prediction_tokens"].get<int64_t>(), 0) << a.dump();
  EXPECT_GE(details["rejected_prediction_tokens"].get<int64_t>(), 0) << a.dump();
  EXPECT_FALSE(b["usage"].contains("completion_tokens_details")) << b.dump();
  auto m = client_->Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* name :
       {"# TYPE metrale_spec_draft_tokens_total counter", "metrale_spec_accepted_tokens_total ",
        "metrale_spec_verify_steps_total ", "# TYPE metrale_request_draft_acceptance histogram",
        "metrale_request_draft_acceptance_bucket{le=\"0.5\"} ",
        "metrale_request_draft_acceptance_bucket{le=\"+Inf\"} 1",
        "metrale_request_draft_acceptance_count 1"}) {
    EXPECT_NE(m->body.find(name), std::string::npos) << name << "\n" << m->body;
  }
}

// One stream slot and one queue place: a third request is refused with 429.
// `metrale serve --lora scribe=DIR`: a request whose model is "scribe" runs with the PEFT
// adapter (tests/data/fixtures/lora/demo, equal to PEFT in tests/engine/lora_parity_test.cc).
class LoraServer : public ServerFixture {
 protected:
  void prepare(Model& m, HttpServerOptions& o) override {
    m.enable_lora({.max_loras = 1, .max_rank = 8})
        .load("scribe", "tests/data/fixtures/lora/demo/scribe", /*pinned=*/true);
    o.adapters = {"scribe"};
  }
};

TEST_F(LoraServer, TheModelFieldPicksTheAdapter) {
  std::string want[2];  // base, scribe: each prompt run alone
  {
    std::unique_ptr<Model> alone = load_demo();
    alone->enable_lora({.max_loras = 1, .max_rank = 8})
        .load("scribe", "tests/data/fixtures/lora/demo/scribe", /*pinned=*/true);
    GenerateOptions g;
    g.max_new_tokens = 16;
    g.ignore_eos = true;
    for (int i = 0; i < 2; ++i) {
      Session session(*alone, i == 0 ? "" : "scribe");
      want[i] = session.generate(alone->tokenizer()->encode("And God said", true), g).text;
    }
  }
  ASSERT_NE(want[0], want[1]) << "the adapter should change the text";
  for (int i = 0; i < 2; ++i) {
    const std::string model = i == 0 ? "demo" : "scribe";
    auto r = post("/v1/completions", R"({"model": ")" + model +
                                         R"(", "prompt": "And God said", "max_tokens": 16,
                                         "temperature": 0, "ignore_eos": true})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], want[i]) << model;
  }
  auto m = client_->Get("/v1/models");
  ASSERT_TRUE(m);
  const json models = json::parse(m->body);
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][1]["id"], "scribe");
  EXPECT_EQ(models["data"][1]["parent"], "demo");
  auto unknown = post("/v1/completions", R"({"model": "nope", "prompt": "x", "max_tokens": 1})");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_NE(unknown->body.find("scribe"), std::string::npos) << unknown->body;
}

class BusyServer : public ServerFixture {
 protected:
  SchedulerOptions scheduler_options() const override { return {.max_seqs = 1, .max_queue = 1}; }
};

// A request of 1000 tokens submitted straight to the scheduler.
ServeRequest long_request() {
  ServeRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 1000;
  r.ignore_eos = true;
  r.timeout = 60s;
  return r;
}

// A long request, once it runs (waiting up to 30 s: a guard against hanging on a loaded
// machine, not a timing assertion).
std::shared_ptr<ServeStream> hog(Scheduler& s) {
  const int64_t running = s.stats().running;
  auto stream = s.submit(long_request());
  for (int i = 0; i < 30000 && s.stats().running == running; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_GT(s.stats().running, running) << "the long request never started";
  return stream;
}

TEST_F(BusyServer, AFullQueueIs429) {
  std::vector<std::shared_ptr<ServeStream>> busy = {hog(*scheduler_)};
  ServeRequest queued;
  queued.prompt = {1, 2, 3};
  queued.timeout = 60s;
  busy.push_back(scheduler_->submit(queued));  // the one queue place
  auto r = post("/v1/completions", R"({"prompt": "And", "max_tokens": 4})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(error_of(r)["type"], "rate_limit_error");
  for (const auto& s : busy) s->cancel();
}

// One stream slot, so a request sent behind a queue of long ones waits for seconds (the demo
// model decodes thousands of tokens a second: a request that merely decodes may finish before
// a test can hang up).
class SerialServer : public ServerFixture {
 protected:
  SchedulerOptions scheduler_options() const override { return {.max_seqs = 1}; }
  void TearDown() override {
    for (const auto& s : queue_) s->cancel();
    ServerFixture::TearDown();
  }
  // 20 requests of 1000 tokens ahead of whatever comes next.
  void fill_queue() {
    for (int i = 0; i < 20; ++i) queue_.push_back(scheduler_->submit(long_request()));
  }
  std::vector<std::shared_ptr<ServeStream>> queue_;
};

// ... where requests time out after 100 ms unless they say otherwise.
class DeadlineServer : public SerialServer {
 protected:
  SchedulerOptions scheduler_options() const override {
    return {.max_seqs = 1, .request_timeout = 100ms};
  }
};

TEST_F(DeadlineServer, ARequestPastItsDeadlineIs503) {
  fill_queue();
  auto r = post("/v1/completions", R"({"prompt": "And", "max_tokens": 4})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(error_of(r)["code"], "timeout");
}

// A non-streaming client that hangs up while its request waits.
TEST_F(SerialServer, AWaitingClientThatLeavesCancelsItsRequest) {
  fill_queue();  // the request below waits behind these
  const int64_t before = scheduler_->stats().requests_cancelled;
  const int fd = connect_to(port_);
  const std::string body = R"({"prompt": "And", "max_tokens": 900, "ignore_eos": true})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                              std::string(kKey) + "\r\nContent-Type: application/json\r\n" +
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::this_thread::sleep_for(100ms);
  close(fd);
  const SchedulerStats st = scheduler_->stats();
  EXPECT_TRUE(saw_cancel(*scheduler_, before))
      << "running " << st.running << " waiting " << st.waiting << " finished "
      << st.requests_finished << " failed " << st.requests_failed << " preemptions "
      << st.preemptions;
}

// /v1/embeddings over the demo model (no sentence-transformers files: last token + L2).
class EmbeddingServer : public ServerFixture {
 protected:
  void prepare(Model& m, HttpServerOptions&) override {
    config_ = load_embedding_config(m.dir(), m.config().hidden_size);
    const std::vector<std::vector<int32_t>> ids = {
        m.tokenizer()->encode("And God said", true),
        m.tokenizer()->encode("Let there be light", true)};
    want_ = embed(m, config_, ids);
    want_cut_ = embed(m, config_, ids, 16);
    ids_ = ids;
  }
  SchedulerOptions scheduler_options() const override {
    return {.max_seqs = 4, .embedding = config_};
  }
  static std::vector<float> floats(const json& values) { return values.get<std::vector<float>>(); }

  EmbeddingConfig config_;
  std::vector<std::vector<float>> want_, want_cut_;
  std::vector<std::vector<int32_t>> ids_;
};

TEST_F(EmbeddingServer, EmbeddingsEqualTheLibrarysInEveryInputForm) {
  auto r = post("/v1/embeddings",
                R"({"input": ["And God said", "Let there be light"], "model": "demo"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "demo");
  ASSERT_EQ(j["data"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["data"][i]["object"], "embedding");
    EXPECT_EQ(j["data"][i]["index"], i);
    EXPECT_EQ(floats(j["data"][i]["embedding"]), want_[i]) << i;
  }
  const auto tokens = static_cast<int64_t>(ids_[0].size() + ids_[1].size());
  EXPECT_EQ(j["usage"], (json{{"prompt_tokens", tokens}, {"total_tokens", tokens}}));
  // Token ids, base64, dimensions.
  auto by_ids = post("/v1/embeddings", json{{"input", ids_}, {"encoding_format", "base64"}}.dump());
  ASSERT_TRUE(by_ids);
  ASSERT_EQ(by_ids->status, 200) << by_ids->body;
  const json b = json::parse(by_ids->body);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(b["data"][i]["embedding"], base64_floats(want_[i])) << i;
  auto one =
      post("/v1/embeddings", json{{"input", "Let there be light"}, {"dimensions", 16}}.dump());
  ASSERT_TRUE(one);
  ASSERT_EQ(one->status, 200) << one->body;
  EXPECT_EQ(floats(json::parse(one->body)["data"][0]["embedding"]), want_cut_[1]);
  // Beside a completion in flight.
  std::thread gen([&] {
    httplib::Client c("127.0.0.1", port_);
    c.set_bearer_token_auth(kKey);
    c.set_read_timeout(30, 0);
    auto g = c.Post("/v1/completions", R"({"prompt": "And", "max_tokens": 40, "ignore_eos": true})",
                    "application/json");
    EXPECT_TRUE(g && g->status == 200);
  });
  auto again = post("/v1/embeddings", R"({"input": ["And God said", "Let there be light"]})");
  gen.join();
  ASSERT_TRUE(again);
  EXPECT_EQ(floats(json::parse(again->body)["data"][1]["embedding"]), want_[1]);
}

TEST_F(EmbeddingServer, BadRequestsAre400NamingTheField) {
  auto expect = [&](const std::string& body, int status, const char* param, const char* code = "") {
    auto r = post("/v1/embeddings", body);
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    const json e = error_of(r);
    EXPECT_EQ(e["param"], param) << body;
    if (*code) {
      EXPECT_EQ(e["code"], code) << body;
    }
  };
  expect(R"({"input": []})", 400, "input");
  expect(R"({"input": "x", "dimensions": 100000})", 400, "dimensions");
  expect(json{{"input", std::vector<int32_t>(5000, 7)}}.dump(), 400, "input",
         "context_length_exceeded");
  expect(R"({"input": [1, 99999]})", 400, "input");
  expect(R"({"input": "x", "model": "nope"})", 404, "model", "model_not_found");
  expect(R"({"input": "x", "encoding_format": "hex"})", 400, "encoding_format");
  // The server keeps serving.
  auto ok = post("/v1/embeddings", R"({"input": "And God said"})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(ServerFixture, EmbeddingsWithoutAConfigAre400) {
  auto r = post("/v1/embeddings", R"({"input": "x"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["code"], "embeddings_unavailable");
}

}  // namespace
}  // namespace metrale::http
