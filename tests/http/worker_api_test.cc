// What routers read from a replica (http/worker_api.h): vLLM's gauge names, labels and values in
// /metrics (KV usage counting what the prefix cache can give back as free, as vLLM's does; the
// LoRA info gauge llm-d's scheduler reads), /get_load, sglang's /server_info and /model_info
// (and their /get_ names), and POST /flush_cache — on a live server over the demo model.
#include "http/worker_api.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "http/http_server.h"

namespace metrale::http {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

bool has_line(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(WorkerApi, VllmGaugesCarryVllmNamesLabelsAndValues) {
  SchedulerStats s;
  s.running = 3;
  s.waiting = 2;
  s.kv_pages_total = 100;
  s.kv_pages_free = 50;
  s.kv_pages_evictable = 25;  // held by the cache alone: free to a router
  s.kv_page_tokens = 16;
  s.prefix_cache = true;
  s.prompt_tokens = 700;
  s.cache.tokens_saved = 300;
  const std::string text = metrics_text(s, {}, "demo", 1.5e9);
  for (const char* line : {
           "vllm:num_requests_running{engine=\"0\",model_name=\"demo\"} 3",
           "vllm:num_requests_waiting{engine=\"0\",model_name=\"demo\"} 2",
           "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"demo\"} 0.25",
           "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"demo\"} 0.25",
           "vllm:cache_config_info{block_size=\"16\",engine=\"0\",enable_prefix_caching=\"True\","
           "num_gpu_blocks=\"100\"} 1",
           "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"demo\"} 700",
           "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"demo\"} 300",
           "# TYPE vllm:num_requests_waiting gauge",
           "metrale_requests_running 3",  // metrale's own names stay
           "metrale_kv_pages_evictable 25",
       }) {
    EXPECT_TRUE(has_line(text, line)) << line << "\n" << text;
  }
  // vLLM exports the LoRA gauge only when LoRA is on.
  EXPECT_EQ(text.find("vllm:lora_requests_info"), std::string::npos);

  s.max_loras = 4;
  s.running_adapters = {"a", "b"};
  s.waiting_adapters = {"c"};
  const std::string lora = metrics_text(s, {}, "demo", 1.5e9);
  EXPECT_TRUE(has_line(lora,
                       "vllm:lora_requests_info{max_lora=\"4\",waiting_lora_adapters=\"c\","
                       "running_lora_adapters=\"a,b\"} 1500000000"))
      << lora;
}

TEST(WorkerApi, LabelValuesAreEscaped) {
  EXPECT_EQ(prometheus_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  const std::string text = metrics_text({}, {}, "we\"ird", 0);
  EXPECT_NE(text.find("model_name=\"we\\\"ird\""), std::string::npos) << text;
}

TEST(WorkerApi, LoadIsRunningPlusWaiting) {
  SchedulerStats s;
  s.running = 3;
  s.waiting = 4;
  s.kv_pages_total = 10;
  s.kv_pages_free = 6;
  s.kv_page_tokens = 16;
  const json j = load_json(s);
  EXPECT_EQ(j["load"], 7);
  EXPECT_EQ(j["num_reqs"], 3);
  EXPECT_EQ(j["num_waiting_reqs"], 4);
  EXPECT_EQ(j["num_tokens"], 64);
}

class WorkerServer : public ::testing::Test {
 protected:
  void SetUp() override {
    LoadOptions lo;
    lo.n_threads = 2;
    lo.kv_tokens = 1024;
    lo.max_rows = 64;
    model_ = Model::load("models/demo", lo);
    scheduler_ = std::make_unique<Scheduler>(*model_, SchedulerOptions{.max_seqs = 3});
    HttpServerOptions o;
    o.port = 0;
    o.model_name = "demo";
    o.threads = 8;
    server_ = std::make_unique<HttpServer>(*scheduler_, std::nullopt, o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    for (int i = 0; i < 300 && !client_->Get("/health"); ++i) std::this_thread::sleep_for(10ms);
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }
  json get(const char* path) {
    auto r = client_->Get(path);
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << path << " " << r->body;
    return json::parse(r->body);
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(WorkerServer, TheRouterEndpointsAnswer) {
  for (const char* path : {"/server_info", "/get_server_info"}) {
    const json info = get(path);
    EXPECT_EQ(info["served_model_name"], "demo") << path;
    EXPECT_EQ(info["context_length"], model_->context_limit()) << path;
    EXPECT_EQ(info["max_running_requests"], 3) << path;
    EXPECT_EQ(info["page_size"], 16) << path;
    EXPECT_EQ(info["dp_size"], 1) << path;
    EXPECT_EQ(info["is_embedding"], false) << path;
    // An absolute path: the routers load the tokenizer from it.
    EXPECT_EQ(info["tokenizer_path"].get<std::string>().front(), '/') << path;
  }
  for (const char* path : {"/model_info", "/get_model_info"}) {
    const json info = get(path);
    EXPECT_EQ(info["is_generation"], true) << path;
    EXPECT_EQ(info["model_type"], "qwen3") << path;
  }
  EXPECT_EQ(get("/get_load")["load"], 0);

  // A finished request leaves its pages cached; /flush_cache (a POST without a body, as the
  // routers send it) drops them.
  auto done = client_->Post("/v1/completions",
                            R"({"prompt": "In the beginning God created the heaven and the earth. )"
                            R"(And the earth was without form", "max_tokens": 4})",
                            "application/json");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200) << done->body;
  ASSERT_GT(scheduler_->stats().cache.pages_held, 0);
  httplib::Request flush;
  flush.method = "POST";
  flush.path = "/flush_cache";
  auto flushed = client_->send(flush);
  ASSERT_TRUE(flushed);
  ASSERT_EQ(flushed->status, 200) << flushed->body;
  EXPECT_GT(json::parse(flushed->body)["pages_freed"], 0);
  EXPECT_EQ(scheduler_->stats().cache.pages_held, 0);

  auto m = client_->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_TRUE(has_line(m->body, "vllm:num_requests_running{engine=\"0\",model_name=\"demo\"} 0"))
      << m->body;
  EXPECT_TRUE(has_line(m->body, "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"demo\"} 0"))
      << m->body;
}

}  // namespace
}  // namespace metrale::http
