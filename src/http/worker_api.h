#pragma once
// What routers and schedulers read from a replica, without any HTTP: the /metrics text and the
// JSON of the router-facing endpoints. docs/deployment.md names the router source lines each one
// serves.
//
//   /metrics            metrale's own metrics (metrale_*), and the gauges vLLM names that the
//                       routers' load-aware policies and llm-d's scheduler (the Gateway API
//                       inference extension's model-server protocol) scrape:
//                       vllm:num_requests_running, vllm:num_requests_waiting,
//                       vllm:kv_cache_usage_perc (and its vLLM v0 name vllm:gpu_cache_usage_perc),
//                       vllm:cache_config_info{block_size, num_gpu_blocks},
//                       vllm:lora_requests_info{max_lora, waiting_lora_adapters,
//                       running_lora_adapters} (with LoRA, as vLLM), and vLLM's prefix-cache and
//                       token counters.
//   /get_load           {"load": running + waiting requests, ...}: vllm-router's power_of_two.
//   /server_info, /get_server_info, /model_info, /get_model_info: sglang's shapes, which
//                       sglang-router (SGLang Model Gateway) reads when it registers a worker.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/scheduler.h"

namespace metrale::http {

// What /metrics reports beside the scheduler's figures: the HTTP front's counters.
struct HttpCounters {
  std::map<int, int64_t> responses_by_status;
  std::map<std::pair<std::string, std::string>, int64_t> finishes;  // (endpoint, reason)
  int64_t client_disconnects = 0;
  int64_t in_flight = 0;
  bool draining = false;
  int64_t connections_open = 0;      // accepted, not yet closed
  int64_t connections_rejected = 0;  // refused past the connection limit
  int64_t requests_timed_out = 0;    // cut past the whole-head / whole-body deadline
};

// Prometheus text exposition (version 0.0.4). `unix_seconds`: now (lora_requests_info's value).
std::string metrics_text(const SchedulerStats& s, const HttpCounters& http,
                         std::string_view model_name, double unix_seconds);

// A Prometheus label value, escaped (\\, \", \n).
std::string prometheus_label(std::string_view value);

// /get_load: {"load": running + waiting, "num_reqs", "num_waiting_reqs", "num_tokens": KV tokens
// in use}.
nlohmann::json load_json(const SchedulerStats& s);

// /server_info: the fields of sglang's that describe this replica (model, context, capacity,
// parallelism 1, page size, LoRA).
nlohmann::json server_info_json(const Scheduler& scheduler, std::string_view model_name,
                                const std::vector<std::string>& adapters);
// /model_info: sglang's {model_path, tokenizer_path, is_generation, model_type, architectures}.
nlohmann::json model_info_json(const Model& model);

}  // namespace metrale::http
