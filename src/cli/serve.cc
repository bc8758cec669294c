// `metrale serve --model DIR`: the OpenAI-compatible HTTP server (http/http_server.h) over the
// continuous-batching scheduler. Prints the URL once it listens. SIGTERM / SIGINT drain it
// (http/http_server.h): /health turns 503 "draining", new requests get 503 with Retry-After, the
// requests in flight finish, for at most --drain-timeout seconds, after which what still runs is
// ended cleanly; then the engine thread joins and the process exits 0. A second signal stops at
// once.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "engine/embedding_config.h"
#include "engine/kv_pool.h"
#include "engine/state_pool.h"
#include "http/http_server.h"
#include "io/config/model_config.h"
#include "kvevents/kv_event_publisher.h"
#include "serve/prefix_cache.h"

namespace metrale::cli {
namespace {

struct ServeFlags {
  ModelFlags model;
  LoraFlags lora;  // each --lora NAME=DIR is served as the model NAME
  SpeculativeFlags spec;
  http::HttpServerOptions http;
  std::string kv_budget;
  std::string chat_template;
  std::string tool_call_parser = "auto";
  std::string reasoning_parser = "auto";
  bool no_prefix_cache = false;
  double request_timeout_s = 600;
  // Below Kubernetes' default terminationGracePeriodSeconds (30), with room for the end.
  double drain_timeout_s = 25;
  // Client limits (HttpServerOptions; docs/reliability.md), in whole seconds.
  int64_t read_timeout_s = 30, write_timeout_s = 30, head_timeout_s = 15, body_timeout_s = 60;
  int64_t keep_alive_timeout_s = 5;
  int64_t prefill_chunk = 0;
  int64_t max_queue = 256;
  int64_t max_embedding_seqs = 32;
  int64_t state_snapshots = -1;     // -1: 2 per stream slot with the prefix cache, else 0
  int64_t marconi_min_tokens = -1;  // -1: DEFAULT_MARCONI_MIN_TOKENS
  kvevents::KvEventPublisherOptions kv_events;  // endpoint "": none
  std::string kv_events_encoding = "map";
  std::vector<std::string> allowed_media_dirs;
  int64_t vision_cache_mb = 256;
};

// --kv-budget BYTES -> KV capacity in tokens: the budget over what one token keeps in every
// layer's cache (kv_shapes, stored as --kv-dtype), read from config.json before the load.
int64_t kv_tokens_for_budget(const std::string& dir, const std::string& budget, DType dtype) {
  const uint64_t bytes = parse_byte_size(budget, "--kv-budget");
  int64_t per_token = 0;
  for (const KvShape& s : kv_shapes(load_model_config(dir))) per_token += s.bytes_per_token(dtype);
  METRALE_CHECK(per_token > 0, dir, ": this model keeps no KV cache; --kv-budget does not apply");
  const auto tokens = static_cast<int64_t>(bytes / static_cast<uint64_t>(per_token));
  METRALE_CHECK(tokens >= 16, "--kv-budget ", budget, " holds ", tokens, " tokens at ", per_token,
                " bytes per token; give at least 16 tokens' worth");
  return std::min<int64_t>(tokens, int64_t{1} << 24);
}

std::optional<chat::ChatTemplate> load_chat_template(const ServeFlags& f, const Model& model) {
  if (!f.chat_template.empty()) {
    std::ifstream in(f.chat_template, std::ios::binary);
    METRALE_CHECK(in.good(), "--chat-template ", f.chat_template, ": cannot read the file");
    std::ostringstream text;
    text << in.rdbuf();
    // The model's named special tokens still reach the template (bos_token, eos_token, ...),
    // as transformers passes its tokenizer's to any template.
    std::map<std::string, std::string> specials;
    const TokenizerConfig& tc = model.tokenizer()->config();
    for (const auto& [name, value] :
         {std::pair{"bos_token", tc.bos_token}, std::pair{"eos_token", tc.eos_token},
          std::pair{"pad_token", tc.pad_token}, std::pair{"unk_token", tc.unk_token}}) {
      if (value) specials[name] = *value;
    }
    return chat::ChatTemplate::from_string(text.str(), f.chat_template, std::move(specials));
  }
  try {
    return chat::ChatTemplate::load(f.model.dir);
  } catch (const Error& e) {
    std::fprintf(stderr,
                 "metrale serve: no chat template (%s); /v1/chat/completions answers 400 "
                 "until one is given with --chat-template FILE\n",
                 e.what());
    return std::nullopt;
  }
}

// A reply-parsing flag (--tool-call-parser, --reasoning-parser): a format by name, or "auto":
// the one `detect` finds in the chat template's source (the template a request with tools
// renders, for tool calls), kNone without a template or when it has several and none is the
// default (chat requests then answer 400 anyway).
template <typename Format>
Format resolve_reply_format(const char* flag_name, const std::string& flag,
                            const std::optional<chat::ChatTemplate>& tmpl, bool with_tools,
                            Format (*from_name)(std::string_view),
                            Format (*detect)(std::string_view)) {
  if (flag != "auto") {
    try {
      return from_name(flag);
    } catch (const Error& e) {
      throw make_error(flag_name, ": ", e.message(), " (or auto)");
    }
  }
  if (!tmpl) return Format::kNone;
  try {
    return detect(tmpl->pick(with_tools).text());
  } catch (const Error&) {
    return Format::kNone;
  }
}

// glibc raises its mmap threshold (up to 32 MiB) each time it gives back a large mmapped
// block; from then on blocks that large come from its arenas and stay there when freed. A
// server's connection threads each allocate as large as their largest request, so that
// memory stayed held: 32 connections that each tokenized 1.3 MB of text left the process at
// 1 GiB (docs/reliability.md). A fixed threshold (which also stops the dynamic one) keeps
// blocks of 256 KiB and more in mmap, given back to the system when freed. A threshold the
// user set (MALLOC_MMAP_THRESHOLD_, GLIBC_TUNABLES) is left alone.
void fix_malloc_mmap_threshold() {
#ifdef __GLIBC__
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
      (tunables != nullptr && std::strstr(tunables, "mmap_threshold") != nullptr)) {
    return;
  }
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
#endif
}

// Gives the free memory inside glibc's arenas back to the system every kTrimPeriod, until
// destroyed. Blocks freed in the middle of an arena stay resident: as a server's threads
// allocate and free, that free space spreads, and the RSS crept up by about 300 bytes a
// request under the soak's load although the live heap stayed flat; malloc_trim took the
// RSS back to its warm-up value (docs/reliability.md). A trim of the server's heap takes well
// under a millisecond.
class MemoryTrimmer {
 public:
  static constexpr std::chrono::seconds kTrimPeriod{10};
  MemoryTrimmer() {
#ifdef __GLIBC__
    thread_ = std::thread([this] {
      std::unique_lock lock(mu_);
      while (!cv_.wait_for(lock, kTrimPeriod, [this] { return stopping_; })) malloc_trim(0);
    });
#endif
  }
  ~MemoryTrimmer() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

void run_serve(ServeFlags f) {
  fix_malloc_mmap_threshold();
  // Signals go to one thread that waits for them; block them before any other thread (the
  // model's thread pool, the scheduler, httplib's pool) exists, so all inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  f.spec.check();
  LoadOptions load = f.model.load_options();
  // Hybrid models resume a cached prefix only from a recurrent-state snapshot taken at its
  // page boundary (serve/prefix_cache.h), so the prefix cache needs snapshot blocks in the
  // state pool; dense models ignore this.
  load.state_snapshots =
      f.state_snapshots >= 0 ? f.state_snapshots : (f.no_prefix_cache ? 0 : 2 * f.model.max_seqs);
  if (!f.kv_budget.empty()) {
    METRALE_CHECK(f.model.kv_tokens == 0, "give only one of --kv-budget and --kv-tokens");
    load.kv_tokens = kv_tokens_for_budget(f.model.dir, f.kv_budget, load.kv_dtype);
  }
  std::unique_ptr<Model> model = Model::load(f.model.dir, load);
  // LoRA adapters, pinned in the slot pool: a request whose "model" is NAME runs with it
  // (so serve has no --adapter).
  f.lora.apply(*model);
  for (const std::string& l : f.lora.loras) f.http.adapters.push_back(l.substr(0, l.find('=')));
  METRALE_CHECK(model->tokenizer() != nullptr, f.model.dir,
                ": no tokenizer.json; the server needs one to read prompts and write text");
  std::optional<chat::ChatTemplate> tmpl = load_chat_template(f, *model);
  f.http.tool_call_format =
      resolve_reply_format("--tool-call-parser", f.tool_call_parser, tmpl, /*with_tools=*/true,
                           chat::tool_call_format_from_name, chat::detect_tool_call_format);
  if (tmpl) {
    f.http.tool_call_spelling = chat::detect_tool_call_spelling(
        f.http.tool_call_format, tmpl->pick(/*with_tools=*/true).text());
  }
  f.http.reasoning_format =
      resolve_reply_format("--reasoning-parser", f.reasoning_parser, tmpl, /*with_tools=*/false,
                           chat::reasoning_format_from_name, chat::detect_reasoning_format);

  if (f.marconi_min_tokens >= 0) set_marconi_min_tokens(f.marconi_min_tokens);
  SchedulerOptions so;
  so.max_seqs = f.model.max_seqs;
  so.max_queue = f.max_queue;
  so.prefill_chunk = f.prefill_chunk;
  f.http.read_timeout = std::chrono::seconds(f.read_timeout_s);
  f.http.write_timeout = std::chrono::seconds(f.write_timeout_s);
  f.http.head_timeout = std::chrono::seconds(f.head_timeout_s);
  f.http.body_timeout = std::chrono::seconds(f.body_timeout_s);
  f.http.keep_alive_timeout = std::chrono::seconds(f.keep_alive_timeout_s);
  so.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.request_timeout_s * 1000));
  so.cache.enabled = !f.no_prefix_cache;
  so.max_embedding_seqs = f.max_embedding_seqs;
  so.vision_cache_bytes = static_cast<size_t>(f.vision_cache_mb) << 20;
  f.http.media.allowed_dirs = http::canonical_media_dirs(f.allowed_media_dirs);
  // /v1/embeddings pools as the checkpoint's sentence-transformers files say (without them:
  // last token + L2 normalisation). Files that do not read leave the server generating and
  // refusing embeddings with their error.
  std::string embeddings = "off";
  try {
    so.embedding = load_embedding_config(model->dir(), model->config().hidden_size);
    embeddings = std::string(pooling_name(so.embedding->pooling)) +
                 (so.embedding->normalize ? " + normalize" : "");
  } catch (const Error& e) {
    f.http.embeddings_unavailable = e.message();
    std::fprintf(stderr, "metrale serve: no embeddings (%s); /v1/embeddings answers 400\n",
                 e.what());
  }
  // MTP carry: the sessions' drafter rows may take as many rows as the target's KV cache
  // holds, in the drafter's own pool beside the running streams'.
  if (f.spec.kind == "mtp" && f.spec.drafter_context().carry) {
    so.carry_tokens = model->kv_pool().n_pages() * model->kv_pool().page_size();
  }
  so.speculation = f.spec.options(*model, so.max_seqs, so.carry_tokens);
  // KV-cache events for KV-aware routers (kvevents/kv_event_publisher.h): bound before the
  // engine starts, closed after it stops.
  std::unique_ptr<kvevents::KvEventPublisher> kv_events;
  if (!f.kv_events.endpoint.empty()) {
    METRALE_CHECK(!f.no_prefix_cache,
                  "--kv-events-endpoint needs the prefix cache (it publishes "
                  "what the cache stores); drop --no-prefix-cache");
    try {
      f.kv_events.encoding = kvevents::kv_event_encoding_from_name(f.kv_events_encoding);
    } catch (const Error& e) {
      throw make_error("--kv-events-encoding: ", e.message());
    }
    kv_events = std::make_unique<kvevents::KvEventPublisher>(f.kv_events);
    so.kv_events = [&kv_events](std::vector<KvCacheEvent> events) {
      kv_events->publish(std::move(events));
    };
    std::fprintf(stderr, "metrale serve: KV-cache events on %s (topic \"%s\")%s%s\n",
                 kv_events->endpoint().c_str(), f.kv_events.topic.c_str(),
                 kv_events->replay_endpoint().empty() ? "" : ", replay on ",
                 kv_events->replay_endpoint().c_str());
  }
  Scheduler scheduler(*model, so);
  const MemoryTrimmer trimmer;

  http::HttpServer server(scheduler, std::move(tmpl), f.http);
  const int port = server.bind();
  std::printf(
      "metrale serve: %s on http://%s:%d/v1 (KV %lld tokens, %lld streams, tool calls: %s, "
      "reasoning: %s, speculative: %s, embeddings: %s)\n",
      server.model_name().c_str(), f.http.host.c_str(), port,
      static_cast<long long>(model->kv_pool().layout().n_pages *
                             model->kv_pool().layout().page_size),
      static_cast<long long>(so.max_seqs),
      std::string(chat::tool_call_format_name(f.http.tool_call_format)).c_str(),
      std::string(chat::reasoning_format_name(f.http.reasoning_format)).c_str(),
      f.spec.kind.c_str(), embeddings.c_str());
  std::fflush(stdout);

  // The first signal drains (on a thread of its own, so a second signal can still cut it
  // short); listen() returns once the drain ends in stop().
  std::atomic<bool> listen_returned{false};
  const auto drain_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.drain_timeout_s * 1000));
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (listen_returned) return;
    std::fprintf(stderr,
                 "metrale serve: %s, draining (%lld requests in flight; at most %g s; a second "
                 "signal stops at once)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM",
                 static_cast<long long>(server.requests_in_flight()), f.drain_timeout_s);
    std::thread drainer([&] {
      const int64_t ended = server.drain(drain_timeout);
      std::fprintf(stderr, "metrale serve: drained (%lld requests ended at the timeout)\n",
                   static_cast<long long>(ended));
    });
    sigwait(&stop_signals, &sig);
    if (!listen_returned) std::fprintf(stderr, "metrale serve: second signal, stopping\n");
    server.stop();
    drainer.join();
  });
  server.listen();
  // listen() returns only after stop() (the drain's end), or when accepting failed: wake the
  // signal thread either way (a pending signal is consumed by its sigwait).
  listen_returned = true;
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
}

void setup(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (continuous batching)");
  // Steps of up to 512 rows (llama-server's micro-batch): a prompt's prefill chunk beside the
  // running streams' decode rows.
  f->model.max_rows = 512;
  f->model.add_to(*cmd);
  f->lora.add_to(*cmd, /*with_adapter=*/false);
  // The shared flag means more here: the scheduler's stream slots, for every model.
  cmd->get_option("--max-seqs")
      ->description("streams decoding at once (hybrid models: also their recurrent-state slots)");
  cmd->add_option("--host", f->http.host,
                  "address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", f->http.port, "TCP port (0: any free one)")
      ->check(CLI::Range(0, 65535));
  f->spec.add_to(*cmd);
  cmd->add_option("--api-key", f->http.api_key,
                  "require 'Authorization: Bearer KEY' on every endpoint but /health");
  cmd->add_option("--model-name", f->http.model_name,
                  "the model id clients use (default: the model directory's name)");
  cmd->add_option("--chat-template", f->chat_template,
                  "a Jinja chat template file to use instead of the checkpoint's");
  cmd->add_option("--tool-call-parser", f->tool_call_parser,
                  "how replies to requests with tools become tool_calls: auto (the format the "
                  "chat template teaches), none, hermes, qwen3_coder, glm45, deepseek_v3, "
                  "mistral, llama3_json");
  cmd->add_option("--reasoning-parser", f->reasoning_parser,
                  "whether a chat reply's <think> block becomes reasoning_content: auto (when "
                  "the chat template writes </think>), none, think");
  cmd->add_option("--kv-budget", f->kv_budget,
                  "bytes for the KV cache (e.g. 2GiB); sets the capacity in tokens");
  cmd->add_flag("--no-prefix-cache", f->no_prefix_cache,
                "do not reuse the KV of shared prompt prefixes");
  cmd->add_option("--request-timeout", f->request_timeout_s,
                  "seconds a request may take, queueing included")
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--drain-timeout", f->drain_timeout_s,
                  "on SIGTERM / SIGINT: seconds the requests in flight may take to finish "
                  "(meanwhile /health is 503 and new requests get 503 with Retry-After); what "
                  "still runs then is ended (default 25; 0: end them at once)")
      ->check(CLI::Range(0.0, 3600.0));
  f->kv_events.endpoint.clear();
  cmd->add_option("--kv-events-endpoint", f->kv_events.endpoint,
                  "publish the prefix cache's KV-cache events (vLLM's wire: ZMQ PUB, msgpack "
                  "BlockStored / BlockRemoved / AllBlocksCleared) on this ZMQ endpoint, e.g. "
                  "tcp://*:5557 (default: none)");
  cmd->add_option("--kv-events-topic", f->kv_events.topic,
                  "the topic of every KV-event message (default \"\", as vLLM's)");
  auto* replay = cmd->add_option(
      "--kv-events-replay-endpoint", f->kv_events.replay_endpoint,
      "also answer replay requests on this ZMQ endpoint (vLLM's replay_endpoint: a ROUTER; a "
      "subscriber sends a start sequence number and gets the kept batches from there, then an "
      "end marker), e.g. tcp://*:5558 (default: none)");
  replay->needs("--kv-events-endpoint");
  cmd->add_option("--kv-events-buffer-steps", f->kv_events.buffer_steps,
                  "batches kept for replay (vLLM's buffer_steps; default 10000, at most 64 MiB "
                  "of them)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->needs(replay);
  cmd->add_option("--kv-events-encoding", f->kv_events_encoding,
                  "map (vLLM's current layout, the default), array (earlier vLLM releases' "
                  "array_like layout) or array-batch (an array batch of map events: what "
                  "vllm-router 0.1.17's kv_aware policy reads)");
  cmd->add_option("--prefill-chunk", f->prefill_chunk,
                  "prompt tokens prefilled per engine step (0: --max-rows)")
      ->check(CLI::Range(int64_t{0}, int64_t{65536}));
  cmd->add_option("--state-snapshots", f->state_snapshots,
                  "hybrid models: recurrent-state snapshots the prefix cache may keep "
                  "(default: 2 per --max-seqs; 0 with --no-prefix-cache)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  cmd->add_option("--marconi-min-tokens", f->marconi_min_tokens,
                  "hybrid models: the shortest cached prefix resumed from a recurrent-state "
                  "snapshot (default " +
                      std::to_string(DEFAULT_MARCONI_MIN_TOKENS) + "; 0: any)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--max-queue", f->max_queue, "waiting requests beyond this get 429")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-embedding-seqs", f->max_embedding_seqs,
                  "embedding inputs prefilled at once beside the --max-seqs streams")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  http::MediaOptions& media = f->http.media;
  cmd->add_option("--allowed-media-dir", f->allowed_media_dirs,
                  "a directory whose files chat requests may name as file:// image / video URLs "
                  "(repeatable; none: file:// URLs are refused; http(s) URLs always are)");
  cmd->add_option("--max-media-bytes", media.max_bytes,
                  "the most encoded bytes of one image or video")
      ->check(CLI::Range(size_t{1}, size_t{1} << 32));
  cmd->add_option("--max-image-pixels", media.max_image_pixels,
                  "the most pixels of one decoded image (or video frame)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  cmd->add_option("--max-video-frames", media.max_video_frames, "the most frames of one video")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-video-seconds", media.max_video_seconds, "the longest video accepted")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_option("--max-media-items", media.max_items, "the most images and videos in one request")
      ->check(CLI::Range(int64_t{0}, int64_t{1024}));
  cmd->add_option("--vision-cache-mb", f->vision_cache_mb,
                  "MiB of vision-tower outputs kept by content hash (0: none), so a chat about one "
                  "image encodes it once")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--max-grammar-bytes", f->http.max_grammar_bytes,
                  "structured outputs: the largest schema / regex / grammar a request may bring")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--http-threads", f->http.threads,
                  "connections served at once (each streaming client holds one)")
      ->check(CLI::Range(2, 4096));
  cmd->add_option("--max-connections", f->http.max_connections,
                  "open connections (served + waiting for a thread); past it a new one gets 503 "
                  "and is closed (default 512; >= --http-threads)")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--max-body-bytes", f->http.max_body_bytes,
                  "largest request body (Content-Length or chunked); larger: 413 (default 16 MiB)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 34));
  cmd->add_option("--max-headers", f->http.max_headers,
                  "header fields per request; more: 431 (default 100; each field is at most "
                  "8192 bytes, cpp-httplib's compiled limit)")
      ->check(CLI::Range(8, 10000));
  cmd->add_option("--head-timeout", f->head_timeout_s,
                  "seconds a request's whole head may take, from the connection's start or its "
                  "previous response (keep-alive wait included; > --keep-alive-timeout; "
                  "default 15)")
      ->check(CLI::Range(int64_t{2}, int64_t{3600}));
  cmd->add_option("--body-timeout", f->body_timeout_s,
                  "seconds a request's whole body may take after its head (default 60)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600}));
  cmd->add_option("--read-timeout", f->read_timeout_s,
                  "seconds a client may stay silent mid-request (default 30)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600}));
  cmd->add_option("--write-timeout", f->write_timeout_s,
                  "seconds a client may not read a reply before it is dropped (default 30)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600}));
  cmd->add_option("--keep-alive-timeout", f->keep_alive_timeout_s,
                  "seconds an idle keep-alive connection stays open (default 5)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600}));
  cmd->add_option("--keep-alive-max", f->http.keep_alive_max,
                  "requests one connection may carry before it is closed (default 100)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([f] { run_serve(*f); });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
