// `metrale bench --model DIR`: prefill and decode tokens/s, peak RSS, and the fraction of
// the memory-bandwidth roofline, with the bandwidth measured in the same run.
// Decode roofline: tokens/s x weight bytes read per token / bandwidth.
// With --speculative KIND: greedy generation of --spec-prompt at each --batch width, with and
// without speculation in the same run — tokens/s of both, the acceptance (mean accepted drafts
// per verify step, and the share of drafts accepted), and whether the outputs are identical.
// With --image FILE: the vision tower alone on that image, instead (cli/bench_image.h).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <span>

#include "backend/op_profiler.h"
#include "cli/bench_image.h"
#include "cli/command.h"
#include "cli/options.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/bandwidth.h"
#include "engine/session.h"

namespace metrale::cli {

void print_profile_table(const OpProfiler& prof, const char* title, const char* unit, double units,
                         double seconds) {
  std::vector<OpProfiler::Entry> rows = prof.entries();
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  const double per = seconds / units;
  std::printf("\n%s: %.2f ms/%s\n", title, per * 1e3, unit);
  std::printf("%-62s %8s %9s/%s %6s\n", "op", "calls", "ms", unit, "%");
  double covered = 0;
  for (const auto& e : rows) {
    covered += e.seconds / units;
    std::printf("%-62s %8.0f %10.3f %6.1f%%\n", e.key.c_str(), static_cast<double>(e.calls) / units,
                e.seconds / units * 1e3, 100.0 * e.seconds / seconds);
  }
  std::printf("%-62s %8s %10.3f %6.1f%%\n", "(between ops: engine, sampling-free loop)", "",
              (per - covered) * 1e3, 100.0 * (per - covered) / per);
}

namespace {

struct BenchFlags {
  ModelFlags model;
  LoraFlags lora;
  SpeculativeFlags spec;
  ImageBenchFlags image;
  std::string spec_prompt;  // "": kDefaultSpecPrompt (random ids without a tokenizer)
  // Decode with LoRA: for each count N, rows cycle through the first N adapters given
  // (0: the base model, through the same pool).
  std::string lora_mix;
  std::string prefill = "128,512";
  std::string batch = "1,4,16";
  int64_t decode_tokens = 64;
  int64_t depth = 16;  // tokens of context each decoding sequence is prefilled with
  int reps = 3;
  bool json = false;
  bool skip_bandwidth = false;
  bool profile = false;
  int64_t profile_batch = 1;
};

// Text whose continuation a prompt-lookup drafter can partly copy (repeated phrases).
constexpr const char* kDefaultSpecPrompt =
    "And God said, Let there be light: and there was light. And God saw the light, that it was "
    "good: and God divided the light from the darkness. And God called the light Day, and the "
    "darkness he called Night. And the evening and the morning were the first day. And God said,";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(
      0, static_cast<int32_t>(std::min<int64_t>(vocab, 32000) - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = d(rng);
  return ids;
}

double bench_prefill(Model& m, int64_t n, int reps) {
  std::vector<float> logits(static_cast<size_t>(m.vocab_size()));
  const std::vector<int32_t> ids = random_ids(n, m.vocab_size(), 1);
  std::vector<double> tps;
  for (int r = 0; r < reps + 1; ++r) {  // the first run warms caches and pages
    Sequence seq;
    const double t0 = now_s();
    m.prefill(seq, ids, logits);
    const double dt = now_s() - t0;
    m.release(seq);
    if (r > 0) tps.push_back(static_cast<double>(n) / dt);
  }
  return median(tps);
}

// adapters: each row's adapter ("" = base), cycled over the batch; empty: all base. Each timed
// run's tokens/s, in run order, into *runs when given.
double bench_decode(Model& m, int64_t batch, int64_t depth, int64_t steps, int reps,
                    const std::vector<std::string>& adapters = {},
                    std::vector<double>* runs = nullptr) {
  const auto B = static_cast<size_t>(batch);
  std::vector<float> logits(B * static_cast<size_t>(m.vocab_size()));
  std::vector<double> tps;
  for (int r = 0; r < reps + 1; ++r) {
    std::vector<Sequence> seqs(B);
    std::vector<Sequence*> ptrs;
    for (size_t i = 0; i < B; ++i) {
      const auto prompt = random_ids(depth, m.vocab_size(), static_cast<uint32_t>(i + 7));
      if (!adapters.empty()) m.set_adapter(seqs[i], adapters[i % adapters.size()]);
      m.prefill(seqs[i], prompt, std::span(logits).first(static_cast<size_t>(m.vocab_size())));
      ptrs.push_back(&seqs[i]);
    }
    std::vector<int32_t> tokens(B, 1);
    const double t0 = now_s();
    for (int64_t s = 0; s < steps; ++s) {
      m.decode(ptrs, tokens, logits);
      for (size_t i = 0; i < B; ++i)
        tokens[i] =
            static_cast<int32_t>((tokens[i] * 31 + 7) % std::min<int64_t>(1000, m.vocab_size()));
    }
    const double dt = now_s() - t0;
    for (Sequence& s : seqs) m.release(s);
    if (r > 0) tps.push_back(static_cast<double>(batch * steps) / dt);
  }
  if (runs != nullptr) *runs = tps;
  return median(tps);
}

struct SpecRun {
  int64_t batch = 0;
  double off_tps = 0, on_tps = 0;
  SpeculationCounts counts;  // of the last timed run, summed over the batch's streams
  bool identical = true;
};

// Greedy generation of `prompt` by `batch` streams (the same prompt each), `tokens` new tokens
// each, without and with speculation; tokens/s are the median over `reps` timed runs after one
// warm-up.
SpecRun bench_speculative(Model& m, const std::vector<int32_t>& prompt, int64_t batch,
                          int64_t tokens, int reps, const SpeculationOptions& spec) {
  const std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch), prompt);
  GenerateOptions o;
  o.max_new_tokens = tokens;
  o.ignore_eos = true;
  SpecRun r{.batch = batch};
  std::vector<std::vector<int32_t>> reference;
  for (const bool on : {false, true}) {
    o.speculation = on ? spec : SpeculationOptions{};
    std::vector<double> tps;
    for (int rep = 0; rep < reps + 1; ++rep) {
      const std::vector<GenerateResult> out = generate_batch(m, prompts, o);
      double generated = 0;
      SpeculationCounts counts;
      for (size_t i = 0; i < out.size(); ++i) {
        generated += static_cast<double>(out[i].tokens.size());
        counts += out[i].speculation;
        if (!on && rep == 0) reference.push_back(out[i].tokens);
        if (on) r.identical = r.identical && out[i].tokens == reference[i];
      }
      if (on) r.counts = counts;
      // One decode clock for the whole batch: the first stream's.
      if (rep > 0 && out[0].decode_seconds > 0) tps.push_back(generated / out[0].decode_seconds);
    }
    (on ? r.on_tps : r.off_tps) = tps.empty() ? 0.0 : median(tps);
  }
  return r;
}

double per_step(const SpeculationCounts& c) {
  return c.verify_steps > 0 ? static_cast<double>(c.accepted) / static_cast<double>(c.verify_steps)
                            : 0.0;
}
double share(const SpeculationCounts& c) {
  return c.drafted > 0 ? static_cast<double>(c.accepted) / static_cast<double>(c.drafted) : 0.0;
}
// The draft positions the run fed (at most SpeculationCounts::kPositions).
size_t positions(const SpeculationCounts& c) {
  size_t n = 0;
  while (n < c.drafted_at.size() && c.drafted_at[n] > 0) ++n;
  return n;
}
// The acceptance at draft position i + 1: of the verify steps that fed that draft, the share
// that accepted it.
double share_at(const SpeculationCounts& c, size_t i) {
  return c.drafted_at[i] > 0
             ? static_cast<double>(c.accepted_at[i]) / static_cast<double>(c.drafted_at[i])
             : 0.0;
}

// Where the time of a decode step of `batch` sequences and of one prefill of `prompt` tokens
// goes, per op (and weight), measured by an OpProfiler watching the backend.
void print_profile(Model& m, int64_t depth, int64_t steps, int64_t prompt, int64_t batch) {
  OpProfiler prof;
  const auto V = static_cast<size_t>(m.vocab_size());
  const auto B = static_cast<size_t>(batch);
  std::vector<float> logits(B * V);
  std::vector<Sequence> seqs(B);
  std::vector<Sequence*> ptrs;
  for (size_t i = 0; i < B; ++i) {
    m.prefill(seqs[i], random_ids(depth, m.vocab_size(), static_cast<uint32_t>(3 + i)),
              std::span(logits).first(V));
    ptrs.push_back(&seqs[i]);
  }
  std::vector<int32_t> tokens(B, 1);
  m.backend().set_observer(&prof);
  m.decode(ptrs, tokens, logits);  // warm-up step, not counted
  prof.reset();
  double t0 = now_s();
  for (int64_t s = 0; s < steps; ++s) {
    for (int32_t& t : tokens)
      t = static_cast<int32_t>((t * 31 + 7) % std::min<int64_t>(1000, m.vocab_size()));
    m.decode(ptrs, tokens, logits);
  }
  double dt = now_s() - t0;
  for (Sequence& s : seqs) m.release(s);
  char title[128];
  std::snprintf(title, sizeof title, "decode step profile (batch %lld, %lld steps, %.1f tokens/s)",
                static_cast<long long>(batch), static_cast<long long>(steps),
                static_cast<double>(batch * steps) / dt);
  print_profile_table(prof, title, "step", static_cast<double>(steps), dt);

  const std::vector<int32_t> ids = random_ids(prompt, m.vocab_size(), 1);
  prof.reset();
  Sequence long_seq;
  t0 = now_s();
  m.prefill(long_seq, ids, std::span(logits).first(V));
  dt = now_s() - t0;
  m.release(long_seq);
  m.backend().set_observer(nullptr);
  std::snprintf(title, sizeof title, "prefill profile (%lld tokens, %.1f tokens/s)",
                static_cast<long long>(prompt), static_cast<double>(prompt) / dt);
  print_profile_table(prof, title, "prefill", 1.0, dt);
}

void run_bench(const BenchFlags& f) {
  if (!f.image.images.empty()) {
    ImageBenchFlags image = f.image;
    image.profile = f.profile;
    run_image_bench(f.model, image, f.json);
    return;
  }
  const std::vector<int64_t> prefills = parse_count_list(f.prefill, "--prefill");
  const std::vector<int64_t> batches = parse_count_list(f.batch, "--batch");
  f.spec.check();
  const std::string spec_text = f.spec_prompt.empty() ? kDefaultSpecPrompt : f.spec_prompt;
  ModelFlags mf = f.model;
  const int64_t longest = *std::max_element(prefills.begin(), prefills.end());
  const int64_t widest = *std::max_element(batches.begin(), batches.end());
  const int64_t widest_all = std::max(widest, f.profile ? f.profile_batch : 1);
  mf.max_rows = std::max(mf.max_rows, widest_all);
  mf.max_seqs = std::max(mf.max_seqs, widest_all);
  // The profile's decode takes one warm-up step more, and each of its sequences starts pages
  // of its own (rounded up to 64 tokens, a multiple of any page size).
  int64_t tokens_per_seq =
      f.profile ? (f.depth + f.decode_tokens + 1 + 63) / 64 * 64 : f.depth + f.decode_tokens;
  // The speculative runs' prompt (at most a token per byte, and special tokens) and drafts.
  if (f.spec.on()) {
    tokens_per_seq = std::max(tokens_per_seq, static_cast<int64_t>(spec_text.size()) + 16 +
                                                  f.decode_tokens + f.spec.max_drafts() + 1);
  }
  if (mf.kv_tokens == 0) mf.kv_tokens = std::max(longest, widest_all * tokens_per_seq) + 64;
  std::unique_ptr<Model> model = load_model(mf);
  Model& m = *model;
  f.lora.apply(m);
  std::vector<int64_t> mixes;
  if (!f.lora_mix.empty()) {
    mixes = parse_list_at_least(f.lora_mix, "--lora-mix", 0);
    for (int64_t n : mixes) {
      METRALE_CHECK(n <= static_cast<int64_t>(f.lora.loras.size()), "--lora-mix ", n, " needs ", n,
                    " --lora adapters; ", f.lora.loras.size(), " given");
    }
  }
  METRALE_CHECK(longest <= m.context_limit(), "--prefill ", longest, " exceeds the context of ",
                m.context_limit());
  const SpeculationOptions spec = f.spec.options(m, widest);
  std::vector<int32_t> spec_prompt;
  if (f.spec.on()) {
    spec_prompt =
        m.tokenizer() != nullptr ? m.tokenizer()->encode(spec_text, true) : std::vector<int32_t>();
    if (spec_prompt.empty()) {  // no tokenizer: a random block, three times
      const std::vector<int32_t> block = random_ids(24, m.vocab_size(), 5);
      for (int i = 0; i < 3; ++i) spec_prompt.insert(spec_prompt.end(), block.begin(), block.end());
    }
  }

  std::vector<double> prefill_tps, decode_tps;
  std::vector<std::vector<double>> decode_runs(batches.size());  // [batch][timed run]
  for (int64_t n : prefills) prefill_tps.push_back(bench_prefill(m, n, f.reps));
  for (size_t i = 0; i < batches.size(); ++i) {
    decode_tps.push_back(
        bench_decode(m, batches[i], f.depth, f.decode_tokens, f.reps, {}, &decode_runs[i]));
  }
  // [mix][batch]
  std::vector<std::vector<double>> lora_tps;
  for (int64_t n : mixes) {
    std::vector<std::string> names;
    for (int64_t i = 0; i < n; ++i) {
      const std::string& l = f.lora.loras[static_cast<size_t>(i)];
      names.push_back(l.substr(0, l.find('=')));
    }
    if (names.empty()) names.push_back("");
    lora_tps.emplace_back();
    for (int64_t b : batches)
      lora_tps.back().push_back(bench_decode(m, b, f.depth, f.decode_tokens, f.reps, names));
  }
  std::vector<SpecRun> spec_runs;
  if (f.spec.on()) {
    for (int64_t b : batches)
      spec_runs.push_back(bench_speculative(m, spec_prompt, b, f.decode_tokens, f.reps, spec));
  }
  // Peak RSS of the model's work, read before the probe's 1 GiB buffer raises the mark.
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const auto rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  double gbs = 0;
  if (!f.skip_bandwidth) gbs = measure_read_bandwidth(m.pool()).gb_per_s;
  // The roofline counts the bytes a decoded token reads: all weights of a dense model but
  // its embedding table, the router and top-k experts of an MoE layer.
  const double bytes = static_cast<double>(m.active_weight_bytes());
  auto roofline = [&](double tps) { return gbs > 0 ? tps * bytes / (gbs * 1e9) : 0.0; };

  if (f.json) {
    std::printf("{\"model\": \"%s\", \"threads\": %d, \"prefill\": {", m.dir().string().c_str(),
                m.pool().size());
    for (size_t i = 0; i < prefills.size(); ++i)
      std::printf("%s\"%lld\": %.3f", i ? ", " : "", static_cast<long long>(prefills[i]),
                  prefill_tps[i]);
    std::printf("}, \"decode\": {");
    for (size_t i = 0; i < batches.size(); ++i)
      std::printf("%s\"%lld\": %.3f", i ? ", " : "", static_cast<long long>(batches[i]),
                  decode_tps[i]);
    // Every timed run, in order: whether a process's runs drift or sit in one mode.
    std::printf("}, \"decode_runs\": {");
    for (size_t i = 0; i < batches.size(); ++i) {
      std::printf("%s\"%lld\": [", i ? ", " : "", static_cast<long long>(batches[i]));
      for (size_t r = 0; r < decode_runs[i].size(); ++r)
        std::printf("%s%.3f", r ? ", " : "", decode_runs[i][r]);
      std::printf("]");
    }
    std::printf("}, \"decode_lora\": {");
    for (size_t j = 0; j < mixes.size(); ++j) {
      std::printf("%s\"%lld\": {", j ? ", " : "", static_cast<long long>(mixes[j]));
      for (size_t i = 0; i < batches.size(); ++i)
        std::printf("%s\"%lld\": %.3f", i ? ", " : "", static_cast<long long>(batches[i]),
                    lora_tps[j][i]);
      std::printf("}");
    }
    if (f.spec.on()) {
      std::printf(
          "}, \"speculative\": {\"kind\": \"%s\", \"draft_tokens\": %lld, "
          "\"draft_tree\": \"%s\", \"prompt_tokens\": %zu, \"new_tokens\": %lld, "
          "\"batches\": {",
          f.spec.kind.c_str(), static_cast<long long>(f.spec.draft_tokens), f.spec.tree.c_str(),
          spec_prompt.size(), static_cast<long long>(f.decode_tokens));
      for (size_t i = 0; i < spec_runs.size(); ++i) {
        const SpecRun& r = spec_runs[i];
        std::printf(
            "%s\"%lld\": {\"off_tps\": %.3f, \"on_tps\": %.3f, \"verify_steps\": %lld, "
            "\"drafted\": %lld, \"accepted\": %lld, \"accepted_per_step\": %.4f, "
            "\"identical\": %s, \"drafted_at\": [",
            i ? ", " : "", static_cast<long long>(r.batch), r.off_tps, r.on_tps,
            static_cast<long long>(r.counts.verify_steps), static_cast<long long>(r.counts.drafted),
            static_cast<long long>(r.counts.accepted), per_step(r.counts),
            r.identical ? "true" : "false");
        for (size_t p = 0; p < positions(r.counts); ++p)
          std::printf("%s%lld", p ? ", " : "", static_cast<long long>(r.counts.drafted_at[p]));
        std::printf("], \"accepted_at\": [");
        for (size_t p = 0; p < positions(r.counts); ++p)
          std::printf("%s%lld", p ? ", " : "", static_cast<long long>(r.counts.accepted_at[p]));
        std::printf("]}");
      }
      std::printf("}");
    }
    std::printf(
        "}, \"lora_pool_bytes\": %llu, \"weight_bytes\": %.0f, \"active_weight_bytes\": %.0f, "
        "\"peak_rss_bytes\": %llu, "
        "\"bandwidth_gbs\": %.3f, \"kv_bytes_per_token\": %lld, \"kv_dtype\": \"%s\", \"depth\": "
        "%lld, "
        "\"decode1_roofline_fraction\": %.4f, \"executor\": \"%s\", \"circuit_steps\": %lld, "
        "\"layer_steps\": %lld, \"barriers_per_step\": %lld, \"fusion\": \"%s\"}\n",
        static_cast<unsigned long long>(m.lora_pool() ? m.lora_pool()->bytes() : 0),
        static_cast<double>(m.weight_bytes()), bytes, static_cast<unsigned long long>(rss), gbs,
        static_cast<long long>(m.kv_pool().bytes_per_token()),
        std::string(dtype_name(m.kv_pool().layout().dtype)).c_str(),
        static_cast<long long>(f.depth),
        batches.empty() ? 0.0 : roofline(decode_tps[0]) / static_cast<double>(batches[0]),
        std::string(executor_name(m.executor())).c_str(), static_cast<long long>(m.circuit_steps()),
        static_cast<long long>(m.layer_steps()),
        static_cast<long long>(m.programs().empty() ? -1 : m.programs().front()->stats().barriers),
        fusion_name(m.fusion()).c_str());
    return;
  }
  std::printf("model: %s, %d thread(s), weights %.1f MB (%s), %.1f MB read per decoded token\n",
              m.dir().string().c_str(), m.pool().size(),
              static_cast<double>(m.weight_bytes()) / 1e6, f.model.placement.c_str(), bytes / 1e6);
  std::printf("KV cache: %lld bytes per token over all layers (%s); decode after %lld tokens\n",
              static_cast<long long>(m.kv_pool().bytes_per_token()),
              std::string(dtype_name(m.kv_pool().layout().dtype)).c_str(),
              static_cast<long long>(f.depth));
  if (gbs > 0) std::printf("read bandwidth (measured now): %.1f GB/s\n", gbs);
  for (size_t i = 0; i < prefills.size(); ++i)
    std::printf("prefill %5lld tokens: %9.1f tokens/s\n", static_cast<long long>(prefills[i]),
                prefill_tps[i]);
  for (size_t i = 0; i < batches.size(); ++i) {
    const double per_seq = decode_tps[i] / static_cast<double>(batches[i]);
    std::printf("decode batch %3lld:     %9.1f tokens/s", static_cast<long long>(batches[i]),
                decode_tps[i]);
    if (gbs > 0) std::printf("  (%.0f%% of the roofline per step)", 100.0 * roofline(per_seq));
    std::printf("\n");
  }
  for (size_t j = 0; j < mixes.size(); ++j) {
    for (size_t i = 0; i < batches.size(); ++i) {
      std::printf(
          "decode batch %3lld, %2lld distinct LoRA adapters: %9.1f tokens/s (%.1f%% of "
          "the base model's)\n",
          static_cast<long long>(batches[i]), static_cast<long long>(mixes[j]), lora_tps[j][i],
          100.0 * lora_tps[j][i] / decode_tps[i]);
    }
  }
  if (f.spec.on()) {
    std::printf(
        "speculative (%s, K = %lld%s%s): greedy, %zu-token prompt, %lld new tokens per stream\n",
        f.spec.kind.c_str(), static_cast<long long>(f.spec.draft_tokens),
        f.spec.tree.empty() ? "" : ", tree ", f.spec.tree.c_str(), spec_prompt.size(),
        static_cast<long long>(f.decode_tokens));
    for (const SpecRun& r : spec_runs) {
      std::printf(
          "  batch %3lld: off %9.1f tokens/s | %s %9.1f tokens/s (%.2fx) | %.2f accepted per "
          "verify step, %.0f%% of %lld drafts | output %s\n",
          static_cast<long long>(r.batch), r.off_tps, f.spec.kind.c_str(), r.on_tps,
          r.off_tps > 0 ? r.on_tps / r.off_tps : 0.0, per_step(r.counts), 100.0 * share(r.counts),
          static_cast<long long>(r.counts.drafted), r.identical ? "identical" : "DIFFERS");
      if (positions(r.counts) > 0) {
        std::printf("             accepted by draft position:");
        for (size_t p = 0; p < positions(r.counts); ++p)
          std::printf(" %zu: %.0f%%", p + 1, 100.0 * share_at(r.counts, p));
        std::printf("\n");
      }
    }
  }
  std::printf("executor: %s, fusion %s", std::string(executor_name(m.executor())).c_str(),
              fusion_name(m.fusion()).c_str());
  if (!m.programs().empty()) {
    const Program::Stats& s = m.programs().front()->stats();
    std::printf(
        " (width 1: %lld split / %lld serial instructions, %lld barriers per step (%lld were "
        "only linears split) vs the layer loop's %lld dispatches; steps run by a program %lld, "
        "by the layer loop %lld)",
        static_cast<long long>(s.partitioned), static_cast<long long>(s.serial),
        static_cast<long long>(s.barriers), static_cast<long long>(s.barriers_unsplit),
        static_cast<long long>(s.layer_dispatches), static_cast<long long>(m.circuit_steps()),
        static_cast<long long>(m.layer_steps()));
  }
  std::printf("\n");
  std::printf("peak RSS: %.1f MB\n", static_cast<double>(rss) / 1e6);
  if (f.profile) print_profile(m, f.depth, f.decode_tokens, longest, f.profile_batch);
}

void setup(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  auto* cmd =
      app.add_subcommand("bench", "measure prefill / decode speed and the bandwidth roofline");
  // Prefill chunks of up to 512 rows, llama-bench's default ubatch (-ub 512), so a 512-token
  // prefill is one pass in both: a mixture of experts then reads each expert once per layer,
  // not once per 128-row chunk (+20-40% at 512 tokens on the DeepSeek-V2-Lite shape).
  f->model.max_rows = 512;
  f->model.add_to(*cmd);
  f->lora.add_to(*cmd);
  f->spec.add_to(*cmd);
  cmd->add_option("--spec-prompt", f->spec_prompt,
                  "with --speculative: the prompt the speculative runs generate from (default: "
                  "a short text with repeated phrases)");
  cmd->add_option("--lora-mix", f->lora_mix,
                  "decode also with LoRA: per count N, rows cycle through the first N --lora "
                  "adapters (0 = base model rows), comma-separated");
  cmd->add_option("--prefill", f->prefill, "prompt lengths to time, comma-separated");
  cmd->add_option("--batch", f->batch, "decode batch widths to time, comma-separated");
  cmd->add_option("--depth", f->depth, "tokens of context before the timed decode steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--decode-tokens", f->decode_tokens, "decode steps per timing")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  cmd->add_option("--reps", f->reps, "timed repetitions (median reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->add_flag("--no-bandwidth", f->skip_bandwidth, "skip the bandwidth probe");
  cmd->add_flag(
      "--profile", f->profile,
      "also print where the time of a decode step (--profile-batch sequences) and of the longest "
      "prefill goes, per op (with --image: of one more tower pass per image)");
  cmd->add_option("--profile-batch", f->profile_batch, "sequences per profiled decode step")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  auto* image = cmd->add_option("--image", f->image.images,
                                "time the vision tower alone on this image (repeatable): "
                                "preprocessed once, then --image-warmup and --image-rounds "
                                "tower passes; instead of the prefill / decode runs")
                    ->check(CLI::ExistingFile);
  cmd->add_option("--image-rounds", f->image.rounds,
                  "with --image: timed tower passes per image (median reported)")
      ->check(CLI::Range(1, 10000))
      ->needs(image);
  cmd->add_option("--image-warmup", f->image.warmup,
                  "with --image: untimed tower passes per image before the timed ones")
      ->check(CLI::Range(0, 1000))
      ->needs(image);
  cmd->add_option("--vision-out", f->image.out,
                  "with --image: write each image's pixel_values.N and tower output vision.N "
                  "(f32; deepstack features after the merger's) to this .safetensors file")
      ->needs(image);
  // The language model's timings do not run with --image: their flags are errors beside it.
  for (const char* name :
       {"--prefill", "--batch", "--depth", "--decode-tokens", "--reps", "--lora-mix",
        "--profile-batch", "--spec-prompt", "--speculative", "--draft-tokens", "--lora"}) {
    image->excludes(cmd->get_option(name));
  }
  cmd->callback([f] { run_bench(*f); });
}

}  // namespace
METRALE_REGISTER_COMMAND(setup);
}  // namespace metrale::cli
