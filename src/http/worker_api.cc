#include "http/worker_api.h"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <sstream>

#include "io/config/model_config.h"

namespace metrale::http {
namespace {

// KV pages requests hold: neither free nor given back by the prefix cache on demand.
int64_t pages_in_use(const SchedulerStats& s) {
  return std::max<int64_t>(0, s.kv_pages_total - s.kv_pages_free - s.kv_pages_evictable);
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

class Exposition {
 public:
  // An unlabelled sample.
  template <typename T>
  void metric(std::string_view name, std::string_view type, std::string_view help, T value) {
    header(name, type, help);
    o_ << name << ' ' << value << '\n';
  }
  // One sample with labels, already formatted as {k="v",...}.
  template <typename T>
  void labelled(std::string_view name, std::string_view type, std::string_view help,
                std::string_view labels, T value) {
    header(name, type, help);
    o_ << name << labels << ' ' << value << '\n';
  }
  void header(std::string_view name, std::string_view type, std::string_view help) {
    o_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  std::ostringstream& out() { return o_; }

 private:
  std::ostringstream o_;
};

}  // namespace

std::string prometheus_label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string metrics_text(const SchedulerStats& s, const HttpCounters& http,
                         std::string_view model_name, double unix_seconds) {
  Exposition e;
  e.metric("metrale_requests_running", "gauge", "Requests decoding in the batch.", s.running);
  e.metric("metrale_requests_waiting", "gauge", "Requests queued for admission.", s.waiting);
  e.metric("metrale_requests_finished_total", "counter", "Requests that finished (stop or length).",
           s.requests_finished);
  e.metric("metrale_requests_cancelled_total", "counter", "Requests cancelled (client gone).",
           s.requests_cancelled);
  e.metric("metrale_requests_timed_out_total", "counter", "Requests past their deadline.",
           s.requests_timed_out);
  e.metric("metrale_requests_failed_total", "counter", "Requests the engine failed.",
           s.requests_failed);
  e.metric("metrale_requests_rejected_total", "counter", "Requests refused (queue full).",
           s.requests_rejected);
  e.metric("metrale_preemptions_total", "counter", "Streams preempted for KV pages (recomputed).",
           s.preemptions);
  e.metric("metrale_media_items_total", "counter", "Images and videos admitted.", s.media_items);
  e.metric("metrale_media_encoded_total", "counter",
           "Images and videos the vision tower encoded (the rest came from its output cache or "
           "lay inside a cached prefix).",
           s.media_encoded);
  e.metric("metrale_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
           s.prompt_tokens);
  e.metric("metrale_prefill_tokens_total", "counter",
           "Prompt tokens computed (not from the cache).", s.prefill_tokens);
  e.metric("metrale_generated_tokens_total", "counter", "Tokens generated.", s.generated_tokens);
  e.metric("metrale_steps_total", "counter", "Engine steps run.", s.steps);
  e.metric("metrale_kv_pages_total", "gauge", "KV cache pages.", s.kv_pages_total);
  e.metric("metrale_kv_pages_free", "gauge", "KV cache pages free.", s.kv_pages_free);
  e.metric("metrale_kv_pages_evictable", "gauge",
           "KV pages only the prefix cache holds (given back on demand).", s.kv_pages_evictable);
  e.metric("metrale_prefix_cache_lookups_total", "counter", "Prefix-cache lookups.",
           s.cache.lookups);
  e.metric("metrale_prefix_cache_hits_total", "counter", "Lookups that adopted a cached prefix.",
           s.cache.hits);
  e.metric("metrale_prefix_cache_tokens_saved_total", "counter",
           "Prompt tokens adopted from the cache instead of computed.", s.cache.tokens_saved);
  e.metric("metrale_prefix_cache_pages_held", "gauge", "KV pages the prefix cache holds.",
           s.cache.pages_held);
  e.metric("metrale_prefix_cache_snapshots_held", "gauge",
           "Recurrent-state snapshots the prefix cache holds.", s.cache.snapshots_held);
  e.metric("metrale_prefix_cache_bytes_held", "gauge", "Bytes the prefix cache holds.",
           s.cache.bytes_held);
  e.metric("metrale_prefix_cache_evicted_pages_total", "counter", "Cached pages evicted.",
           s.cache.evicted_pages);
  e.metric("metrale_prefix_cache_evicted_snapshots_total", "counter", "Cached snapshots evicted.",
           s.cache.evicted_snapshots);
  e.metric("metrale_spec_verify_steps_total", "counter",
           "Speculative verify steps (a stream's step with at least one draft).",
           s.speculation.verify_steps);
  e.metric("metrale_spec_draft_tokens_total", "counter", "Draft tokens the model verified.",
           s.speculation.drafted);
  e.metric("metrale_spec_accepted_tokens_total", "counter", "Draft tokens the model accepted.",
           s.speculation.accepted);
  e.header("metrale_request_draft_acceptance", "histogram",
           "Per finished speculative request: accepted / drafted tokens.");
  for (size_t b = 0; b < std::size(SchedulerStats::kAcceptanceBuckets); ++b) {
    e.out() << "metrale_request_draft_acceptance_bucket{le=\""
            << SchedulerStats::kAcceptanceBuckets[b] << "\"} " << s.acceptance_le[b] << '\n';
  }
  e.out() << "metrale_request_draft_acceptance_bucket{le=\"+Inf\"} " << s.acceptance_count << '\n'
          << "metrale_request_draft_acceptance_sum " << s.acceptance_sum << '\n'
          << "metrale_request_draft_acceptance_count " << s.acceptance_count << '\n';
  e.header("metrale_mtp_carry_total", "counter",
           "Speculating requests by what the MTP carry gave them (their session's drafter rows).");
  for (size_t o = 0; o < std::size(s.carry_outcomes); ++o) {
    e.out() << "metrale_mtp_carry_total{outcome=\""
            << speculative::carry_outcome_name(static_cast<speculative::CarryOutcome>(o)) << "\"} "
            << s.carry_outcomes[o] << '\n';
  }
  e.metric("metrale_mtp_carry_rows_adopted_total", "counter",
           "Drafter rows adopted from a session's previous request.", s.carry_rows_adopted);
  e.metric("metrale_drafter_prefill_rows_total", "counter",
           "Drafter rows computed by drafter prefills (the spans carry did not cover).",
           s.drafter_prefill_rows);
  e.metric("metrale_mtp_carry_rows_held", "gauge", "Drafter rows kept for sessions.",
           s.carry_rows_held);
  e.metric("metrale_http_client_disconnects_total", "counter",
           "Requests whose client went away before the end.", http.client_disconnects);
  e.metric("metrale_http_requests_in_flight", "gauge",
           "Generation requests admitted and not yet answered (what a drain waits for).",
           http.in_flight);
  e.metric("metrale_http_connections_open", "gauge", "Connections accepted and not yet closed.",
           http.connections_open);
  e.metric("metrale_http_connections_rejected_total", "counter",
           "Connections refused (503) past --max-connections.", http.connections_rejected);
  e.metric("metrale_http_requests_timed_out_total", "counter",
           "Requests cut for not sending their head or body within its deadline.",
           http.requests_timed_out);
  e.metric("metrale_server_draining", "gauge", "1 while the server drains (shutting down).",
           http.draining ? 1 : 0);
  e.header("metrale_http_requests_finished_total", "counter",
           "Generation requests answered, by endpoint and finish reason.");
  for (const auto& [key, n] : http.finishes) {
    e.out() << "metrale_http_requests_finished_total{endpoint=\"" << key.first
            << "\",finish_reason=\"" << key.second << "\"} " << n << '\n';
  }
  e.header("metrale_http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, n] : http.responses_by_status) {
    e.out() << "metrale_http_responses_total{code=\"" << code << "\"} " << n << '\n';
  }

  // vLLM's names and labels (vllm/v1/metrics/loggers.py), for the routers and schedulers that
  // read a vLLM replica's /metrics (docs/deployment.md).
  const std::string labels = "{engine=\"0\",model_name=\"" + prometheus_label(model_name) + "\"}";
  const double usage = s.kv_pages_total > 0 ? static_cast<double>(pages_in_use(s)) /
                                                  static_cast<double>(s.kv_pages_total)
                                            : 0.0;
  e.labelled("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
             labels, s.running);
  e.labelled("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
             labels, s.waiting);
  e.labelled("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             labels, usage);
  e.labelled("vllm:gpu_cache_usage_perc", "gauge",
             "KV-cache usage (vLLM v0's name of vllm:kv_cache_usage_perc). 1 means 100 percent "
             "usage.",
             labels, usage);
  e.labelled("vllm:cache_config_info", "gauge", "Information of the KV cache's configuration.",
             "{block_size=\"" + std::to_string(s.kv_page_tokens) + "\",engine=\"0\"," +
                 "enable_prefix_caching=\"" + (s.prefix_cache ? "True" : "False") +
                 "\",num_gpu_blocks=\"" + std::to_string(s.kv_pages_total) + "\"}",
             1);
  e.labelled("vllm:num_preemptions_total", "counter",
             "Cumulative number of preemption from the engine.", labels, s.preemptions);
  e.labelled("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", labels,
             s.prompt_tokens);
  e.labelled("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
             labels, s.generated_tokens);
  e.labelled("vllm:prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.", labels,
             s.prompt_tokens);
  e.labelled("vllm:prefix_cache_hits_total", "counter",
             "Prefix cache hits, in terms of number of cached tokens.", labels,
             s.cache.tokens_saved);
  if (s.max_loras > 0) {
    // vLLM's: one sample, its value the time it was set; an adapter list is names joined by
    // commas.
    std::ostringstream value;
    value.precision(17);
    value << unix_seconds;
    e.labelled("vllm:lora_requests_info", "gauge", "Running stats on lora requests.",
               "{max_lora=\"" + std::to_string(s.max_loras) + "\",waiting_lora_adapters=\"" +
                   prometheus_label(join(s.waiting_adapters)) + "\",running_lora_adapters=\"" +
                   prometheus_label(join(s.running_adapters)) + "\"}",
               value.str());
  }
  return e.out().str();
}

nlohmann::json load_json(const SchedulerStats& s) {
  return {{"load", s.running + s.waiting},
          {"num_reqs", s.running},
          {"num_waiting_reqs", s.waiting},
          {"num_tokens", pages_in_use(s) * s.kv_page_tokens}};
}

nlohmann::json server_info_json(const Scheduler& scheduler, std::string_view model_name,
                                const std::vector<std::string>& adapters) {
  const Model& model = scheduler.model();
  const SchedulerStats s = scheduler.stats();
  const std::string dir = std::filesystem::absolute(model.dir()).lexically_normal().string();
  return {{"model_path", dir},
          {"tokenizer_path", dir},
          {"served_model_name", std::string(model_name)},
          {"context_length", model.context_limit()},
          {"max_total_tokens", s.kv_pages_total * s.kv_page_tokens},
          {"max_running_requests", scheduler.options().max_seqs},
          {"page_size", s.kv_page_tokens},
          {"tp_size", 1},
          {"dp_size", 1},
          {"pp_size", 1},
          {"is_embedding", false},
          {"disaggregation_mode", "null"},
          {"enable_lora", s.max_loras > 0},
          {"max_loras_per_batch", s.max_loras},
          {"lora_names", adapters}};
}

nlohmann::json model_info_json(const Model& model) {
  const std::string dir = std::filesystem::absolute(model.dir()).lexically_normal().string();
  return {{"model_path", dir},
          {"tokenizer_path", dir},
          {"is_generation", true},
          {"model_type", model.config().model_type},
          {"has_image_understanding", !model.config().vision_config_json.empty()}};
}

}  // namespace metrale::http
