#include "engine/session.h"

#include <algorithm>

#include "core/error.h"
#include "speculative/mtp_carry.h"

namespace metrale {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void check_options(const GenerateOptions& o) {
  METRALE_CHECK(o.max_new_tokens >= 0, "max_new_tokens must be >= 0, found ", o.max_new_tokens);
}

GenerationParams params_of(const Model& model, const GenerateOptions& o, uint64_t seed) {
  return {
      .sampling = o.sampling,
      .seed = seed,
      .eos_ids = o.eos_ids.empty() ? default_eos_ids(model) : o.eos_ids,
      .ignore_eos = o.ignore_eos,
      .stop = o.stop_strings,
      .skip_special_tokens = true,
      .max_tokens = o.max_new_tokens,
      // The token that ends generation is never fed, so the input may reach one past what
      // the sequence can hold.
      .max_input = model.context_limit() + 1,
      .end_shows_partial_char = true,
  };
}

GenerateResult result_of(const Generation& gen, GenerateResult r) {
  r.tokens.assign(gen.generated().begin(), gen.generated().end());
  r.text = gen.text();
  r.stop = gen.end().value_or(StopReason::kMaxTokens);
  return r;
}

void report(const std::string& text, const TextCallback& on_text) {
  if (on_text && !text.empty()) on_text(text);
}

}  // namespace

std::vector<int32_t> default_eos_ids(const Model& model) {
  std::vector<int32_t> eos;
  for (int64_t id : model.config().eos_token_ids) eos.push_back(static_cast<int32_t>(id));
  if (const Tokenizer* tok = model.tokenizer(); tok != nullptr && tok->eos_id()) {
    if (std::find(eos.begin(), eos.end(), *tok->eos_id()) == eos.end())
      eos.push_back(*tok->eos_id());
  }
  return eos;
}

struct Session::Carry {
  std::shared_ptr<speculative::DraftProposer> proposer;
  std::unique_ptr<speculative::ProposerState> state;
  speculative::CarryRecord record;
  std::vector<float> last_hidden;
  ~Carry() {
    if (state != nullptr) proposer->free_state(*state);
  }
};

Session::Session(Model& model, const std::string& adapter) : model_(model) {
  model_.set_adapter(seq_, adapter);
}
Session::~Session() {
  carry_.reset();
  model_.release(seq_);
}

GenerateResult Session::generate(std::span<const int32_t> prompt, const GenerateOptions& o,
                                 const TextCallback& on_text) {
  return run(prompt, nullptr, o, on_text);
}

GenerateResult Session::generate(const MultimodalPrompt& prompt, const GenerateOptions& o,
                                 const TextCallback& on_text) {
  METRALE_CHECK(o.speculation.proposer == nullptr || !o.speculation.proposer->needs_hidden(),
                "generate: a drafter that reads the target's hidden states (",
                o.speculation.proposer ? o.speculation.proposer->name() : "",
                ") does not take "
                "prompts with images or videos yet; use --speculative ngram or off");
  return run(
      prompt.ids,
      [&](std::span<float> logits) { prefill_multimodal(model_, seq_, prompt, logits); }, o,
      on_text);
}

GenerateResult Session::run(std::span<const int32_t> prompt,
                            const std::function<void(std::span<float>)>& media_prefill,
                            const GenerateOptions& o, const TextCallback& on_text) {
  check_options(o);
  carry_rows_adopted_ = 0;
  // The carried drafter state serves only the same proposer over an unchanged sequence.
  std::unique_ptr<Carry> carry = std::move(carry_);
  const std::shared_ptr<speculative::DraftProposer>& proposer = o.speculation.proposer;
  if (carry != nullptr && (media_prefill || carry->proposer != proposer ||
                           !o.speculation.drafter_prefill || carry->record.tokens != seq_.tokens)) {
    carry.reset();
  }
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  // The context is the whole conversation so far: the repetition penalty sees it.
  std::vector<int32_t> context = seq_.tokens;
  context.insert(context.end(), prompt.begin(), prompt.end());
  Generation gen(params_of(model_, o, o.seed), std::move(context), model_.tokenizer());
  Speculator spec(model_, o.speculation);
  std::vector<float> logits(static_cast<size_t>(model_.vocab_size()));
  const auto t0 = Clock::now();
  if (media_prefill)
    media_prefill(logits);
  else
    spec.prefill(seq_, prompt, logits);
  r.prefill_seconds = seconds_since(t0);
  const auto t1 = Clock::now();
  gen.accept(gen.pick(logits, spec.scratch()));
  // Taken after every step (with or without a callback), so nothing stays undoable.
  report(gen.take(Release::kCertain).text, on_text);
  DecodeStream stream{.seq = &seq_, .gen = &gen};
  const auto before = carry != nullptr ? static_cast<int64_t>(carry->record.tokens.size()) : 0;
  try {
    if (!gen.ended() && carry != nullptr) {
      // The carry's bookkeeping as the server's: the rows of keys 0..adopt_through hold, and
      // keys from adopt_through + 1 are appended from the target's hiddens — the carried last
      // row (position before - 1) and this prefill's (before ..).
      const speculative::CarryDecision d = speculative::usable_by(
          &carry->record, {.session = 1, .hidden_source = 1, .prompt = seq_.tokens});
      const speculative::AppendPlan plan = speculative::plan_append(
          d.adopt_through, before - 1, static_cast<int64_t>(seq_.tokens.size()));
      if (d.outcome == speculative::CarryOutcome::kAdopted && plan.missing == 0 &&
          d.adopt_through == before - 2) {
        const int64_t H = model_.config().hidden_size;
        const ConstRows fresh = spec.prompt_hidden();
        std::vector<float> rows(carry->last_hidden);
        for (int64_t i = 0; i < fresh.n_rows; ++i)
          rows.insert(rows.end(), fresh.row(i), fresh.row(i) + H);
        spec.adopt(stream, std::move(carry->state), d.adopt_through + 1,
                   {rows.data(), static_cast<int64_t>(rows.size()) / H, H, H});
        carry_rows_adopted_ = d.adopt_through + 1;
      }
      carry.reset();
    }
    if (!gen.ended()) spec.start(stream);
    DecodeStream* const one = &stream;
    while (!gen.ended()) {
      spec.step({&one, 1});
      report(gen.take(Release::kCertain).text, on_text);
    }
  } catch (...) {
    spec.stop(stream);
    throw;
  }
  // (Without drafter prefill the rows do not start at key 0: nothing to carry.)
  if (stream.drafter != nullptr && spec.needs_hidden() && o.speculation.drafter_prefill &&
      !media_prefill) {
    // Left for the next turn: the drafter's rows over the sequence as it now stands.
    auto next = std::make_unique<Carry>();
    next->proposer = proposer;
    next->state = spec.take(stream, next->record.last_key);
    next->record.session = 1;
    next->record.hidden_source = 1;
    next->record.tokens = seq_.tokens;
    next->last_hidden = stream.last_hidden;
    carry_ = std::move(next);
    // A state whose rows do not end at the sequence's last token cannot be extended.
    if (carry_->record.last_key != static_cast<int64_t>(seq_.tokens.size()) - 2) carry_.reset();
  }
  spec.stop(stream);
  report(gen.take(Release::kAll).text, on_text);
  r.decode_seconds = seconds_since(t1);
  r.speculation = stream.counts;
  return result_of(gen, std::move(r));
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
  std::vector<DecodeStream> streams(n);
  std::vector<GenerateResult> results(n);
  std::vector<float> logits(V);
  Speculator spec(model, o.speculation);
  gens.reserve(n);
  try {
    for (size_t i = 0; i < n; ++i) {
      gens.emplace_back(params_of(model, o, o.seed + i), prompts[i], model.tokenizer());
      results[i].prompt_tokens = static_cast<int64_t>(prompts[i].size());
      const auto t0 = Clock::now();
      if (!adapters.empty()) model.set_adapter(seqs[i], adapters[i]);
      spec.prefill(seqs[i], prompts[i], logits);
      results[i].prefill_seconds = seconds_since(t0);
      streams[i] = {.seq = &seqs[i], .gen = &gens[i]};
      if (!gens[i].ended()) {
        gens[i].accept(gens[i].pick(logits, spec.scratch()));
        gens[i].take(Release::kCertain);
      }
      if (!gens[i].ended()) spec.start(streams[i]);
    }
    const auto t1 = Clock::now();
    std::vector<DecodeStream*> step;
    for (;;) {
      // Every unfinished stream decodes in the step: the token it accepted last, and its
      // drafts.
      step.clear();
      for (DecodeStream& s : streams) {
        if (!s.gen->ended()) step.push_back(&s);
      }
      if (step.empty()) break;
      spec.step(step);
      for (DecodeStream* s : step) s->gen->take(Release::kCertain);  // keeps nothing undoable
    }
    for (size_t i = 0; i < n; ++i) {
      results[i].decode_seconds = seconds_since(t1);
      results[i].speculation = streams[i].counts;
      gens[i].take(Release::kAll);
      results[i] = result_of(gens[i], std::move(results[i]));
    }
  } catch (...) {
    for (DecodeStream& s : streams) spec.stop(s);
    for (Sequence& s : seqs) model.release(s);
    throw;
  }
  for (DecodeStream& s : streams) spec.stop(s);
  for (Sequence& s : seqs) model.release(s);
  return results;
}

}  // namespace metrale
