// The graceful stop: HttpServer::drain() over the demo model, with one stream slot held by
// long requests submitted straight to the scheduler, so the HTTP requests under test wait in
// the queue for as long as the test wants (no timing). While draining: /health is 503
// {"status": "draining"}, new generation (and render) requests are 503 with Retry-After, and the
// requests in flight finish with their whole answer; past the timeout they end cleanly (a stream
// with an error event and [DONE], a waiting request with a 503). Lifecycle itself is tested alone.
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <thread>

#include "http/http_server.h"
#include "http/lifecycle.h"
#include "http/openai_api.h"

namespace metrale::http {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// Waits up to 30 s for `ready` (a guard against hanging, not a timing assertion).
template <typename F>
bool eventually(F&& ready) {
  for (int i = 0; i < 3000; ++i) {
    if (ready()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST(Lifecycle, DrainWaitsForTheRequestsInFlight) {
  Lifecycle life;
  std::shared_ptr<void> a = life.admit(), b = life.admit();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(life.in_flight(), 2);
  a.reset();
  EXPECT_EQ(life.in_flight(), 1);
  auto drained = std::async(std::launch::async, [&] { return life.drain(1h, 1h); });
  ASSERT_TRUE(eventually([&] { return life.draining(); }));
  EXPECT_EQ(life.admit(), nullptr) << "a draining lifecycle admits nothing";
  EXPECT_GE(life.retry_after_seconds(), 3000);  // the drain's deadline is an hour away
  EXPECT_FALSE(life.ending());
  b.reset();  // the last request ends: the drain is over, nothing had to be ended
  EXPECT_EQ(drained.get(), 0);
  EXPECT_FALSE(life.ending());
}

TEST(Lifecycle, PastItsTimeoutADrainEndsWhatRuns) {
  Lifecycle life;
  std::shared_ptr<void> held = life.admit();
  std::thread holder;
  // A request that ends itself once it sees ending(), as the HTTP handlers do.
  holder = std::thread([&] {
    EXPECT_TRUE(eventually([&] { return life.ending(); }));
    held.reset();
  });
  EXPECT_EQ(life.drain(0ms, 1h), 1);
  EXPECT_TRUE(life.ending());
  EXPECT_EQ(life.in_flight(), 0);
  EXPECT_EQ(life.retry_after_seconds(), 1);
  holder.join();
}

TEST(Lifecycle, StopCutsADrainShort) {
  Lifecycle life;
  std::shared_ptr<void> held = life.admit();
  auto drained = std::async(std::launch::async, [&] { return life.drain(1h, 1h); });
  ASSERT_TRUE(eventually([&] { return life.draining(); }));
  life.stop();
  EXPECT_EQ(drained.get(), 0);
  EXPECT_TRUE(life.stopping());
  EXPECT_EQ(life.drain(1h, 1h), 0) << "a second drain returns at once";
}

std::unique_ptr<Model> load_demo() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 1024;
  o.max_rows = 64;
  return Model::load("models/demo", o);
}

// One stream slot, so whatever HTTP sends waits behind hold().
class DrainServer : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load_demo();
    HttpServerOptions o;
    o.port = 0;
    o.model_name = "demo";
    o.threads = 16;
    scheduler_ = std::make_unique<Scheduler>(*model_, SchedulerOptions{.max_seqs = 1});
    server_ = std::make_unique<HttpServer>(*scheduler_, std::nullopt, o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
    ASSERT_TRUE(eventually([&] { return static_cast<bool>(client().Get("/health")); }));
  }
  void TearDown() override {
    release();
    server_->stop();
    thread_.join();
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  // 20 requests of 900 tokens straight to the scheduler (seconds of work even on a fast
  // machine; each fits the KV cache beside what the prefix cache holds, so none is preempted),
  // once the first runs: they hold the one slot until release().
  void hold() {
    for (int i = 0; i < 20; ++i) {
      ServeRequest r;
      r.prompt = {1, 2, 3};
      r.max_tokens = 900;
      r.ignore_eos = true;
      r.timeout = 120s;
      hogs_.push_back(scheduler_->submit(r));
    }
    ASSERT_TRUE(eventually([&] { return scheduler_->stats().running == 1; }));
  }
  void release() {
    for (const auto& h : hogs_) h->cancel();
  }
  // Until `n` HTTP requests were admitted and wait in the scheduler behind the hogs.
  bool queued(int64_t n) const {
    return eventually([&] {
      return server_->requests_in_flight() == n &&
             scheduler_->stats().waiting == static_cast<int64_t>(hogs_.size()) - 1 + n;
    });
  }
  // A streamed completion on its own thread; its SSE body when it ends.
  std::future<std::string> stream(const std::string& body) const {
    return std::async(std::launch::async, [this, body] {
      std::string out;
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body;
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        out.append(data, n);
        return true;
      };
      auto r = client().send(req);
      EXPECT_TRUE(r) << "the stream's connection failed: " << httplib::to_string(r.error());
      if (r) {
        EXPECT_EQ(r->status, 200) << out;
      }
      return out;
    });
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<HttpServer> server_;
  std::vector<std::shared_ptr<ServeStream>> hogs_;
  std::thread thread_;
  int port_ = 0;
};

constexpr const char* kStream =
    R"({"prompt": "And God said", "max_tokens": 24, "temperature": 0, "ignore_eos": true,
        "stream": true})";

// The text of an SSE completion stream.
std::string streamed_text(const std::string& sse) {
  std::string text;
  for (size_t at = sse.find("data: {"); at != std::string::npos; at = sse.find("data: {", at + 1)) {
    const json j = json::parse(sse.substr(at + 6, sse.find("\n\n", at) - at - 6));
    if (j.contains("choices") && !j["choices"].empty()) {
      text += j["choices"][0]["text"].get<std::string>();
    }
  }
  return text;
}

TEST_F(DrainServer, InFlightStreamsFinishWhileNewRequestsAreRefused) {
  // The reference: the same request before any drain.
  auto alone = client().Post("/v1/completions",
                             R"({"prompt": "And God said", "max_tokens": 24, "temperature": 0,
                                 "ignore_eos": true})",
                             "application/json");
  ASSERT_TRUE(alone);
  ASSERT_EQ(alone->status, 200) << alone->body;
  const std::string want = json::parse(alone->body)["choices"][0]["text"];

  hold();
  std::future<std::string> in_flight = stream(kStream);
  ASSERT_TRUE(queued(1)) << "the stream never queued";
  auto drained = std::async(std::launch::async, [&] { return server_->drain(120s); });
  ASSERT_TRUE(eventually([&] { return server_->draining(); }));

  auto health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(json::parse(health->body)["status"], "draining") << health->body;
  EXPECT_EQ(json::parse(health->body)["requests_in_flight"], 1);
  // The render endpoints too: a router renders on the replica it may place a request on.
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/v1/completions/render",
                           "/v1/chat/completions/render"}) {
    auto refused = client().Post(path, R"({"prompt": "x", "max_tokens": 1})", "application/json");
    ASSERT_TRUE(refused) << path;
    EXPECT_EQ(refused->status, 503) << path;
    EXPECT_EQ(json::parse(refused->body)["error"]["code"], "server_draining") << refused->body;
    ASSERT_TRUE(refused->has_header("Retry-After")) << path;
    EXPECT_GE(std::stoll(refused->get_header_value("Retry-After")), 60) << path;
  }
  auto metrics = client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("metrale_server_draining 1\n"), std::string::npos);

  release();  // the slot frees: the queued stream runs to its end
  const std::string sse = in_flight.get();
  EXPECT_EQ(sse.rfind("data: [DONE]\n\n"), sse.size() - 14) << sse;
  EXPECT_EQ(sse.find("\"error\""), std::string::npos) << sse;
  EXPECT_NE(sse.find("\"finish_reason\":\"length\""), std::string::npos) << sse;
  EXPECT_EQ(streamed_text(sse), want);
  EXPECT_EQ(drained.get(), 0) << "nothing had to be ended";
  thread_.join();  // the drain ended in stop(): listen() returned
  thread_ = std::thread([] {});
}

TEST_F(DrainServer, PastTheTimeoutRequestsEndCleanly) {
  hold();
  std::future<std::string> in_flight = stream(kStream);
  auto whole = std::async(std::launch::async, [this] {
    return client().Post("/v1/completions", R"({"prompt": "And", "max_tokens": 4})",
                         "application/json");
  });
  ASSERT_TRUE(queued(2));
  EXPECT_EQ(server_->drain(0ms), 2) << "both requests were still waiting";

  // The stream: an error event the OpenAI SDKs raise, then [DONE], on a well-formed response.
  const std::string sse = in_flight.get();
  EXPECT_NE(sse.find("\"code\":\"server_shutting_down\""), std::string::npos) << sse;
  EXPECT_EQ(sse.rfind("data: [DONE]\n\n"), sse.size() - 14) << sse;
  // The waiting non-streaming request: a 503 to retry.
  auto r = whole.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "server_shutting_down");
  EXPECT_TRUE(r->has_header("Retry-After"));
  thread_.join();
  thread_ = std::thread([] {});
}

}  // namespace
}  // namespace metrale::http
