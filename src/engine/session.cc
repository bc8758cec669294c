#include "engine/session.h"

#include <algorithm>

#include "core/error.h"

namespace metrale {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Per-sequence generation state shared by Session::generate and generate_batch.
class Generation {
 public:
  Generation(Model& model, const GenerateOptions& o, std::vector<int32_t> eos, uint64_t seed)
      : model_(model), o_(o), eos_(std::move(eos)), rng_(seed), sampler_(model.vocab_size()) {}

  // Picks the next token from `logits` (modified in place by the processors).
  int32_t pick(std::span<float> logits, const Sequence& seq) {
    if (o_.sampling.temperature <= 0.0f && o_.sampling.repetition_penalty == 1.0f) {
      return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    if (o_.sampling.temperature <= 0.0f) {
      sampler_.process(logits,
                       {.temperature = 1.0f, .repetition_penalty = o_.sampling.repetition_penalty},
                       seq.tokens);
      return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    return sampler_.sample(logits, o_.sampling, seq.tokens, rng_);
  }

  // Records `token`; returns false when generation is over (result.stop says why).
  bool accept(int32_t token, GenerateResult& r, const TextCallback& on_text) {
    if (!o_.ignore_eos && std::find(eos_.begin(), eos_.end(), token) != eos_.end()) {
      r.stop = StopReason::kEos;
      return false;
    }
    r.tokens.push_back(token);
    if (const Tokenizer* tok = model_.tokenizer()) {
      // An id the tokenizer lacks (a padding row of a larger embedding) prints nothing, as
      // the tokenizers library skips it.
      if (tok->id_to_token(token).has_value()) text_ids_.push_back(token);
      r.text = tok->decode(text_ids_, /*skip_special_tokens=*/true);
      for (const std::string& stop : o_.stop_strings) {
        const size_t at = stop.empty() ? std::string::npos : r.text.find(stop);
        if (at != std::string::npos) {
          r.text.resize(at);
          r.stop = StopReason::kStopString;
          return false;
        }
      }
      stream(r.text, on_text);
    }
    if (static_cast<int64_t>(r.tokens.size()) >= o_.max_new_tokens) {
      r.stop = StopReason::kMaxTokens;
      return false;
    }
    return true;
  }

  // Reports the rest of the final text.
  void finish(const GenerateResult& r, const TextCallback& on_text) {
    if (on_text && r.text.size() > emitted_) on_text(std::string_view(r.text).substr(emitted_));
    emitted_ = r.text.size();
  }

 private:
  // Reports what is certain of `text` so far: not a trailing partial character (the decoder
  // shows it as U+FFFD), and not the last (longest stop string - 1) bytes, which a stop
  // string completed by a later token would cut away.
  void stream(const std::string& text, const TextCallback& on_text) {
    if (!on_text || text.ends_with("\xEF\xBF\xBD")) return;
    size_t hold = 0;
    for (const std::string& s : o_.stop_strings)
      hold = std::max(hold, s.empty() ? 0 : s.size() - 1);
    const size_t upto = text.size() > hold ? text.size() - hold : 0;
    if (upto > emitted_) {
      on_text(std::string_view(text).substr(emitted_, upto - emitted_));
      emitted_ = upto;
    }
  }

  Model& model_;
  const GenerateOptions& o_;
  std::vector<int32_t> eos_;
  Rng rng_;
  Sampler sampler_;
  std::vector<int32_t> text_ids_;  // the generated ids the tokenizer knows
  size_t emitted_ = 0;
};

std::vector<int32_t> resolve_eos(const Model& model, const GenerateOptions& o) {
  return o.eos_ids.empty() ? default_eos_ids(model) : o.eos_ids;
}

void check_options(const GenerateOptions& o) {
  METRALE_CHECK(o.max_new_tokens >= 0, "max_new_tokens must be >= 0, found ", o.max_new_tokens);
}

}  // namespace

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kEos:
      return "eos";
    case StopReason::kStopString:
      return "stop string";
    case StopReason::kMaxTokens:
      return "max tokens";
    case StopReason::kContextFull:
      return "context full";
  }
  return "?";
}

std::vector<int32_t> default_eos_ids(const Model& model) {
  std::vector<int32_t> eos;
  for (int64_t id : model.config().eos_token_ids) eos.push_back(static_cast<int32_t>(id));
  if (const Tokenizer* tok = model.tokenizer(); tok != nullptr && tok->eos_id()) {
    if (std::find(eos.begin(), eos.end(), *tok->eos_id()) == eos.end())
      eos.push_back(*tok->eos_id());
  }
  return eos;
}

Session::Session(Model& model, const std::string& adapter) : model_(model) {
  model_.set_adapter(seq_, adapter);
}
Session::~Session() { model_.release(seq_); }

GenerateResult Session::generate(std::span<const int32_t> prompt, const GenerateOptions& o,
                                 const TextCallback& on_text) {
  return run(
      static_cast<int64_t>(prompt.size()),
      [&](std::span<float> logits) { model_.prefill(seq_, prompt, logits); }, o, on_text);
}

GenerateResult Session::generate(const MultimodalPrompt& prompt, const GenerateOptions& o,
                                 const TextCallback& on_text) {
  return run(
      static_cast<int64_t>(prompt.ids.size()),
      [&](std::span<float> logits) { prefill_multimodal(model_, seq_, prompt, logits); }, o,
      on_text);
}

GenerateResult Session::run(int64_t prompt_tokens,
                            const std::function<void(std::span<float>)>& prefill,
                            const GenerateOptions& o, const TextCallback& on_text) {
  check_options(o);
  GenerateResult r;
  r.prompt_tokens = prompt_tokens;
  Generation gen(model_, o, resolve_eos(model_, o), o.seed);
  std::vector<float> logits(static_cast<size_t>(model_.vocab_size()));
  const auto t0 = Clock::now();
  prefill(logits);
  r.prefill_seconds = seconds_since(t0);
  const auto t1 = Clock::now();
  if (o.max_new_tokens > 0) {
    int32_t next = gen.pick(logits, seq_);
    while (gen.accept(next, r, on_text)) {
      if (static_cast<int64_t>(seq_.tokens.size()) >= model_.context_limit()) {
        r.stop = StopReason::kContextFull;
        break;
      }
      Sequence* one = &seq_;
      model_.decode({&one, 1}, {&next, 1}, logits);
      next = gen.pick(logits, seq_);
    }
  }
  gen.finish(r, on_text);
  r.decode_seconds = seconds_since(t1);
  return r;
}

std::vector<GenerateResult> generate_batch(Model& model,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& o,
                                           const std::vector<std::string>& adapters) {
  check_options(o);
  const size_t n = prompts.size();
  METRALE_CHECK(adapters.empty() || adapters.size() == n, "generate_batch: ", adapters.size(),
                " adapters for ", n, " prompts");
  const auto V = static_cast<size_t>(model.vocab_size());
  std::vector<Sequence> seqs(n);
  std::vector<Generation> gens;
  std::vector<GenerateResult> results(n);
  std::vector<int32_t> next(n);
  std::vector<bool> live(n, o.max_new_tokens > 0);
  std::vector<float> logits(n * V);
  gens.reserve(n);
  const std::vector<int32_t> eos = resolve_eos(model, o);
  try {
    for (size_t i = 0; i < n; ++i) {
      gens.emplace_back(model, o, eos, o.seed + i);
      results[i].prompt_tokens = static_cast<int64_t>(prompts[i].size());
      const auto t0 = Clock::now();
      std::span<float> row(logits.data() + i * V, V);
      if (!adapters.empty()) model.set_adapter(seqs[i], adapters[i]);
      model.prefill(seqs[i], prompts[i], row);
      results[i].prefill_seconds = seconds_since(t0);
      if (live[i]) {
        next[i] = gens[i].pick(row, seqs[i]);
        live[i] = gens[i].accept(next[i], results[i], nullptr);
      }
    }
    const auto t1 = Clock::now();
    std::vector<Sequence*> step;
    std::vector<int32_t> step_tokens;
    std::vector<size_t> which;
    for (;;) {
      step.clear();
      step_tokens.clear();
      which.clear();
      for (size_t i = 0; i < n; ++i) {
        if (!live[i]) continue;
        if (static_cast<int64_t>(seqs[i].tokens.size()) >= model.context_limit()) {
          results[i].stop = StopReason::kContextFull;
          live[i] = false;
          continue;
        }
        step.push_back(&seqs[i]);
        step_tokens.push_back(next[i]);
        which.push_back(i);
      }
      if (step.empty()) break;
      for (size_t b = 0; b < step.size(); b += static_cast<size_t>(model.max_rows())) {
        const size_t m = std::min(step.size() - b, static_cast<size_t>(model.max_rows()));
        model.decode(std::span(step).subspan(b, m), std::span(step_tokens).subspan(b, m),
                     std::span(logits).first(m * V));
        for (size_t j = 0; j < m; ++j) {
          const size_t i = which[b + j];
          std::span<float> row(logits.data() + j * V, V);
          next[i] = gens[i].pick(row, seqs[i]);
          live[i] = gens[i].accept(next[i], results[i], nullptr);
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      results[i].decode_seconds = seconds_since(t1);
      gens[i].finish(results[i], nullptr);
    }
  } catch (...) {
    for (Sequence& s : seqs) model.release(s);
    throw;
  }
  for (Sequence& s : seqs) model.release(s);
  return results;
}

}  // namespace metrale
