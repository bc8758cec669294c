// llama-greedy: greedy decoding with llama.cpp's C API, for bench/compare/run.py's greedy check.
//
//   llama-greedy -m MODEL.gguf --ids 1,2,3 -n 16 [-t THREADS] [--load-mode mmap|none]
//                [--lora ADAPTER.gguf] [-v]
//
// Loads the GGUF on the CPU, decodes the prompt ids exactly as given (no bos or other special
// token added), then picks N tokens by argmax of the logits (llama_get_logits_ith; no sampler
// chain; ties go to the lower id, as metrale's greedy path) and prints one JSON line:
//   {"ids": [...N ids...], "top2_margins": [...top1 - top2 logit at each step...],
//    "top2_ids": [...the runner-up at each step...], "prompt": [...], "n_vocab": V,
//    "kv_cache_log": "llama_kv_cache: size = ... K (f16): ..., V (f16): ...", "lora": ..., ...}
// kv_cache_log is llama.cpp's own line on the KV cache it allocated (cells, layers, K and V
// types and sizes; V 0 MiB where an MLA model keeps only the latent), so what it really
// allocates is on record beside the bytes per token computed from the GGUF.
// --lora: a LoRA adapter GGUF (convert_lora_to_gguf.py) loaded with llama_adapter_lora_init and
// applied to the context at scale 1 (llama_set_adapters_lora) before the prompt.
// Built by tools/bench/llama_cpp_peer.py (ensure_greedy_tool) against the static libraries of
// the pinned llama.cpp build; written against that version's include/llama.h.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

bool g_verbose = false;
std::string g_kv_cache_log;  // llama.cpp's "llama_kv_cache: size = ..." line

void log_cb(ggml_log_level level, const char* text, void*) {
  if (g_verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
  if (std::strncmp(text, "llama_kv_cache: size", 20) == 0) {
    g_kv_cache_log = text;
    while (!g_kv_cache_log.empty() && g_kv_cache_log.back() == '\n') g_kv_cache_log.pop_back();
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama-greedy: %s\n", msg.c_str());
  std::exit(1);
}

std::vector<llama_token> parse_ids(const std::string& text) {
  std::vector<llama_token> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = text.find(',', pos);
    const std::string item =
        text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    char* rest = nullptr;
    const long v = std::strtol(item.c_str(), &rest, 10);
    if (item.empty() || *rest != '\0' || v < 0)
      die("--ids: expected comma-separated ids, got '" + text + "'");
    out.push_back(static_cast<llama_token>(v));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, ids_text, load_mode = "mmap", lora_path;
  int n_predict = 16, threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "-m" || a == "--model")
      model_path = value();
    else if (a == "--ids")
      ids_text = value();
    else if (a == "-n")
      n_predict = std::atoi(value().c_str());
    else if (a == "-t" || a == "--threads")
      threads = std::atoi(value().c_str());
    else if (a == "--load-mode")
      load_mode = value();
    else if (a == "--lora")
      lora_path = value();
    else if (a == "-v" || a == "--verbose")
      g_verbose = true;
    else
      die("unknown argument " + a + " (usage: llama-greedy -m GGUF --ids 1,2,3 -n N -t T)");
  }
  if (model_path.empty() || ids_text.empty()) die("give -m MODEL.gguf and --ids 1,2,3");
  if (n_predict < 1 || threads < 1) die("-n and -t must be >= 1");
  if (load_mode != "mmap" && load_mode != "none") die("--load-mode: mmap or none");
  std::vector<llama_token> prompt = parse_ids(ids_text);

  llama_log_set(log_cb, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.load_mode = load_mode == "mmap" ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (model == nullptr) die("cannot load " + model_path);
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (llama_token t : prompt)
    if (t >= n_vocab)
      die("prompt id " + std::to_string(t) + " >= n_vocab " + std::to_string(n_vocab));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(prompt.size() + n_predict + 16);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(prompt.size() < 512 ? 512 : prompt.size());
  cp.n_threads = cp.n_threads_batch = threads;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) die("cannot create a context");
  llama_adapter_lora* adapter = nullptr;
  if (!lora_path.empty()) {
    adapter = llama_adapter_lora_init(model, lora_path.c_str());
    if (adapter == nullptr) die("cannot load the LoRA adapter " + lora_path);
    float scale = 1.0f;
    if (llama_set_adapters_lora(ctx, &adapter, 1, &scale) != 0)
      die("llama_set_adapters_lora failed");
  }

  std::vector<llama_token> ids;
  std::vector<float> margins;
  std::vector<llama_token> runners_up;
  std::vector<llama_token> input = prompt;
  for (int step = 0; step < n_predict; ++step) {
    // llama_batch_get_one: positions follow the context's memory; logits for the last token only.
    if (llama_decode(ctx, llama_batch_get_one(input.data(), static_cast<int32_t>(input.size()))) !=
        0)
      die("llama_decode failed at step " + std::to_string(step));
    const float* logits = llama_get_logits_ith(ctx, -1);
    if (logits == nullptr) die("no logits at step " + std::to_string(step));
    int32_t best = 0, second = -1;
    float top1 = logits[0], top2 = -INFINITY;
    for (int32_t v = 1; v < n_vocab; ++v) {
      if (logits[v] > top1) {  // strictly greater: a tie keeps the lower id
        top2 = top1;
        second = best;
        top1 = logits[v];
        best = v;
      } else if (logits[v] > top2) {
        top2 = logits[v];
        second = v;
      }
    }
    ids.push_back(best);
    margins.push_back(top1 - top2);
    runners_up.push_back(second);
    input.assign(1, best);
  }

  std::string json = "{\"ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) json += (i ? ", " : "") + std::to_string(ids[i]);
  json += "], \"top2_margins\": [";
  char buf[32];
  for (size_t i = 0; i < margins.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.6g", static_cast<double>(margins[i]));
    json += (i ? ", " : "") + std::string(buf);
  }
  json += "], \"top2_ids\": [";
  for (size_t i = 0; i < runners_up.size(); ++i)
    json += (i ? ", " : "") + std::to_string(runners_up[i]);
  json += "], \"prompt\": [";
  for (size_t i = 0; i < prompt.size(); ++i) json += (i ? ", " : "") + std::to_string(prompt[i]);
  json += "], \"n_vocab\": " + std::to_string(n_vocab) +
          ", \"threads\": " + std::to_string(threads) + ", \"load_mode\": \"" + load_mode +
          "\", \"kv_cache_log\": " + json_string(g_kv_cache_log) +
          ", \"lora\": " + (lora_path.empty() ? std::string("null") : json_string(lora_path)) + "}";
  std::puts(json.c_str());

  llama_free(ctx);
  if (adapter != nullptr) llama_adapter_lora_free(adapter);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
