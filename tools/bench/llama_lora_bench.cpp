// llama-lora-bench: llama.cpp's batched decode tokens/s with and without one LoRA adapter, in
// one process, for bench/compare/run.py --lora-mix.
//
//   llama-lora-bench -m MODEL.gguf --lora ADAPTER.gguf -npl 4,16 [-npp 16] [-ntg 64] [-t T]
//                    [-c CTX] [--load-mode none|mmap] [-v]
//
// Why not llama-batched-bench --lora: the pinned build's llama-batched-bench parses --lora
// (a common argument) but loads the model and context with llama_model_load_from_file /
// llama_init_from_model, never common_init_from_params, so the adapter is never loaded or
// applied (it even accepts a path that does not exist); llama-bench has no LoRA option. This
// tool repeats llama-batched-bench's timed work (tools/batched-bench/batched-bench.cpp, its
// default pattern: every sequence prefills -npp random tokens of its own, then -ntg steps
// decode one token per sequence, logits for every row; S_TG = B x ntg / time of those steps)
// with the same context parameters (n_batch 2048, n_ubatch 512, flash attention auto,
// non-unified KV, n_seq_max = widest batch), once on the base model and once with the adapter
// applied to the whole context at scale 1 (llama_set_adapters_lora: one adapter for every
// sequence is llama.cpp's only mode). Each (batch, adapter) pair gets one warm-up step first.
// Prints one JSON line: {"decode": {"B": tps}, "decode_lora": {"1": {"B": tps}}, ...}.
// Built by tools/bench/llama_cpp_peer.py (ensure_tool) against the pinned build's static
// libraries; written against that version's include/llama.h.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml.h"
#include "llama.h"

namespace {

bool g_verbose = false;

void log_cb(ggml_log_level level, const char* text, void*) {
  if (g_verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama-lora-bench: %s\n", msg.c_str());
  std::exit(1);
}

std::vector<int> parse_list(const std::string& text, const char* what) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = text.find(',', pos);
    const std::string item =
        text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    char* rest = nullptr;
    const long v = std::strtol(item.c_str(), &rest, 10);
    if (item.empty() || *rest != '\0' || v < 1)
      die(std::string(what) + ": expected comma-separated positive integers, got '" + text + "'");
    out.push_back(static_cast<int>(v));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

struct Batch {
  llama_batch b;
  explicit Batch(int n) : b(llama_batch_init(n, 0, 1)) {}
  ~Batch() { llama_batch_free(b); }
  void clear() { b.n_tokens = 0; }
  void add(llama_token t, llama_pos pos, llama_seq_id seq, bool logits) {
    const int i = b.n_tokens++;
    b.token[i] = t;
    b.pos[i] = pos;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = logits;
  }
};

// Decodes `batch` in pieces of n_batch tokens, as llama-batched-bench's decode_helper.
void decode(llama_context* ctx, Batch& batch, int n_batch, bool synchronize) {
  for (int i = 0; i < batch.b.n_tokens; i += n_batch) {
    const int n = std::min(n_batch, batch.b.n_tokens - i);
    llama_batch view = {n,
                        batch.b.token + i,
                        nullptr,
                        batch.b.pos + i,
                        batch.b.n_seq_id + i,
                        batch.b.seq_id + i,
                        batch.b.logits + i};
    const int ret = llama_decode(ctx, view);
    if (ret != 0) die("llama_decode failed (" + std::to_string(ret) + ")");
    if (synchronize) llama_synchronize(ctx);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, lora_path, npl_text, load_mode = "none";
  int npp = 16, ntg = 64, threads = 1, n_ctx = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "-m" || a == "--model")
      model_path = value();
    else if (a == "--lora")
      lora_path = value();
    else if (a == "-npl")
      npl_text = value();
    else if (a == "-npp")
      npp = std::atoi(value().c_str());
    else if (a == "-ntg")
      ntg = std::atoi(value().c_str());
    else if (a == "-t" || a == "--threads")
      threads = std::atoi(value().c_str());
    else if (a == "-c")
      n_ctx = std::atoi(value().c_str());
    else if (a == "--load-mode")
      load_mode = value();
    else if (a == "-v" || a == "--verbose")
      g_verbose = true;
    else
      die("unknown argument " + a +
          " (usage: llama-lora-bench -m GGUF --lora GGUF -npl 4,16 [-npp 16] [-ntg 64] [-t T])");
  }
  if (model_path.empty() || lora_path.empty() || npl_text.empty())
    die("give -m MODEL.gguf, --lora ADAPTER.gguf and -npl 4,16");
  if (npp < 1 || ntg < 1 || threads < 1) die("-npp, -ntg and -t must be >= 1");
  if (load_mode != "mmap" && load_mode != "none") die("--load-mode: mmap or none");
  const std::vector<int> npl = parse_list(npl_text, "-npl");
  const int widest = *std::max_element(npl.begin(), npl.end());
  if (n_ctx == 0) n_ctx = widest * (npp + ntg) + 64;

  llama_log_set(log_cb, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.load_mode = load_mode == "mmap" ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (model == nullptr) die("cannot load " + model_path);
  llama_adapter_lora* adapter = llama_adapter_lora_init(model, lora_path.c_str());
  if (adapter == nullptr) die("cannot load the LoRA adapter " + lora_path);
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n_ctx);
  cp.n_batch = 2048;
  cp.n_ubatch = 512;
  cp.n_seq_max = static_cast<uint32_t>(widest);
  cp.n_threads = cp.n_threads_batch = threads;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
  cp.kv_unified = false;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) die("cannot create a context");
  llama_memory_t mem = llama_get_memory(ctx);

  std::mt19937 rng(1);
  auto token = [&]() { return static_cast<llama_token>(rng() % static_cast<uint32_t>(n_vocab)); };
  Batch batch(std::max(widest * npp, 16));
  std::string decode_json, lora_json;
  for (int with_lora = 0; with_lora < 2; ++with_lora) {
    float scale = 1.0f;
    if (llama_set_adapters_lora(ctx, with_lora ? &adapter : nullptr, with_lora ? 1 : 0,
                                with_lora ? &scale : nullptr) != 0)
      die("llama_set_adapters_lora failed");
    std::string& json = with_lora ? lora_json : decode_json;
    for (size_t k = 0; k < npl.size(); ++k) {
      const int pl = npl[k];
      double t_tg = 0;
      for (int warm = 1; warm >= 0; --warm) {  // a warm-up pass (one step), then the timed one
        const int steps = warm ? 1 : ntg;
        llama_memory_clear(mem, false);
        batch.clear();
        for (int j = 0; j < pl; ++j)
          for (int i = 0; i < npp; ++i) batch.add(token(), i, j, i == npp - 1);
        decode(ctx, batch, static_cast<int>(cp.n_batch), false);
        llama_synchronize(ctx);
        const int64_t t0 = ggml_time_us();
        for (int i = 0; i < steps; ++i) {
          batch.clear();
          for (int j = 0; j < pl; ++j) batch.add(token(), npp + i, j, true);
          decode(ctx, batch, static_cast<int>(cp.n_batch), true);
        }
        t_tg = static_cast<double>(ggml_time_us() - t0) / 1e6;
      }
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s\"%d\": %.3f", k ? ", " : "", pl,
                    static_cast<double>(pl) * ntg / t_tg);
      json += buf;
    }
  }
  std::printf(
      "{\"decode\": {%s}, \"decode_lora\": {\"1\": {%s}}, \"lora\": \"%s\", \"npp\": %d, "
      "\"ntg\": %d, \"threads\": %d, \"n_ctx\": %d, \"load_mode\": \"%s\"}\n",
      decode_json.c_str(), lora_json.c_str(), lora_path.c_str(), npp, ntg, threads, n_ctx,
      load_mode.c_str());

  llama_free(ctx);
  llama_adapter_lora_free(adapter);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
