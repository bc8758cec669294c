#include "grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include "core/error.h"
#include "grammar/grammar_text.h"
#include "grammar/utf8_guard.h"

#if METRALE_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace metrale {

std::string GrammarSpec::key() const {
  std::string k(1, static_cast<char>('0' + static_cast<int>(kind)));
  if (kind == Kind::kChoice) {
    for (const std::string& c : choices) {
      k += std::to_string(c.size());
      k += ':';
      k += c;
    }
  } else {
    k += std::to_string(prefix.size()) + ':' + prefix + std::to_string(suffix.size()) + ':' +
         suffix + text;
  }
  return k;
}

int grammar_mask_threads() {
  static const int n = [] {
    if (const char* env = std::getenv("METRALE_GRAMMAR_THREADS"); env != nullptr) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      METRALE_CHECK(end != env && *end == '\0' && v >= 0 && v <= 64,
                    "METRALE_GRAMMAR_THREADS: expected an integer in [0, 64], found '", env, "'");
      return static_cast<int>(v);
    }
    return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 4, 1u, 4u));
  }();
  return n;
}

void apply_token_mask(std::span<const uint32_t> mask, std::span<float> logits) {
  const size_t n = logits.size();
  METRALE_CHECK(mask.size() * 32 >= n, "grammar mask: ", mask.size(), " words for ", n, " logits");
  const float ninf = -std::numeric_limits<float>::infinity();
  float* row = logits.data();
  for (size_t w = 0, base = 0; base < n; ++w, base += 32) {
    const uint32_t word = mask[w];
    if (word == 0xffffffffu) continue;
    const size_t len = std::min<size_t>(32, n - base);
    if (word == 0) {
      std::fill_n(row + base, len, ninf);
      continue;
    }
    uint32_t off = ~word;
    if (len < 32) off &= (1u << len) - 1u;
    for (; off != 0; off &= off - 1) row[base + static_cast<size_t>(std::countr_zero(off))] = ninf;
  }
}

#if METRALE_HAVE_XGRAMMAR

using grammar_detail::check_hex_escapes;
using grammar_detail::ebnf_literal;
using grammar_detail::resolve_structural_tag;
using grammar_detail::vocab_bytes;

bool grammar_available() { return true; }

class CompiledGrammar {
 public:
  CompiledGrammar(xgrammar::CompiledGrammar g, std::shared_ptr<const Utf8Guard> guard)
      : g_(std::move(g)), guard_(std::move(guard)) {}
  const xgrammar::CompiledGrammar& get() const { return g_; }
  const Utf8Guard& guard() const { return *guard_; }

 private:
  xgrammar::CompiledGrammar g_;
  std::shared_ptr<const Utf8Guard> guard_;  // the tokenizer's, shared by its grammars
};

namespace {

// xgrammar's message without its "[hh:mm:ss] path/file.cc:line: " prefix.
std::string engine_message(std::string m) {
  if (m.starts_with("[")) {
    const size_t close = m.find("] ");
    const size_t colon = close == std::string::npos ? close : m.find(": ", close + 2);
    if (colon != std::string::npos && m.find(".cc:", close) < colon) m = m.substr(colon + 2);
  }
  return m;
}

}  // namespace

struct GrammarCompiler::Impl {
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  // Structural tags compile over a second view of the vocabulary in which the special tokens
  // are tokens a "token" element can name (xgrammar's token edges skip the tokens it counts as
  // special, those of empty text): each is its text behind the bytes FF FE, which no UTF-8
  // text matches, so no text element (a JSON string, a regex, an XML value) ever allows one.
  xgrammar::TokenizerInfo marker_info;
  xgrammar::GrammarCompiler marker_compiler;
  std::map<std::string, AddedTokenInfo, std::less<>> added;  // added tokens by their text
  std::shared_ptr<const Utf8Guard> guard;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const CompiledGrammar>> cache;
  Impl(xgrammar::TokenizerInfo i, xgrammar::TokenizerInfo mi, int threads)
      : info(std::move(i)),
        compiler(info, threads, /*cache_enabled=*/false),
        marker_info(std::move(mi)),
        marker_compiler(marker_info, threads, /*cache_enabled=*/false) {}
};

namespace {

xgrammar::TokenizerInfo make_info(std::vector<std::string> vocab, int64_t vocab_size,
                                  const std::vector<int32_t>& eos_ids) {
  std::vector<int32_t> stops;
  for (int32_t e : eos_ids)
    if (e >= 0 && e < vocab_size) stops.push_back(e);
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, static_cast<int>(vocab_size),
                                 stops, false);
}

}  // namespace

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int64_t vocab_size,
                                 std::vector<int32_t> eos_ids)
    : vocab_size_(vocab_size) {
  int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  std::vector<std::string> bytes = vocab_bytes(tokenizer, vocab_size, /*markers=*/false);
  auto guard = std::make_shared<const Utf8Guard>(bytes, vocab_size);
  impl_ = std::make_unique<Impl>(
      make_info(std::move(bytes), vocab_size, eos_ids),
      make_info(vocab_bytes(tokenizer, vocab_size, /*markers=*/true), vocab_size, eos_ids),
      threads);
  impl_->guard = std::move(guard);
  for (const AddedTokenInfo& a : tokenizer.added_tokens()) impl_->added.emplace(a.content, a);
}

GrammarCompiler::~GrammarCompiler() = default;

size_t GrammarCompiler::cached() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cache.size();
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  const std::string key = spec.key();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) return it->second;
  }
  std::optional<xgrammar::CompiledGrammar> g;
  try {
    switch (spec.kind) {
      case GrammarSpec::Kind::kJsonObject:
        // Any JSON object (OpenAI's json_object; xgrammar's builtin grammar is any value).
        g = impl_->compiler.CompileJSONSchema(R"({"type":"object"})", /*any_whitespace=*/false,
                                              std::nullopt,
                                              std::make_pair(std::string(","), std::string(":")),
                                              /*strict_mode=*/false);
        break;
      case GrammarSpec::Kind::kJsonSchema:
        check_schema_keywords(spec.text, spec.field);
        // Compact separators (no free whitespace): a weak model cannot wander in blanks.
        if (spec.prefix.empty() && spec.suffix.empty()) {
          g = impl_->compiler.CompileJSONSchema(spec.text, /*any_whitespace=*/false, std::nullopt,
                                                std::make_pair(std::string(","), std::string(":")),
                                                /*strict_mode=*/true);
        } else {
          std::vector<xgrammar::Grammar> parts;
          if (!spec.prefix.empty())
            parts.push_back(xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(spec.prefix)));
          parts.push_back(xgrammar::Grammar::FromJSONSchema(
              spec.text, /*any_whitespace=*/false, std::nullopt,
              std::make_pair(std::string(","), std::string(":")), /*strict_mode=*/true));
          if (!spec.suffix.empty())
            parts.push_back(xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(spec.suffix)));
          g = impl_->compiler.CompileGrammar(xgrammar::Grammar::Concat(parts));
        }
        break;
      case GrammarSpec::Kind::kStructuralTag:
        g = impl_->marker_compiler.CompileStructuralTag(
            resolve_structural_tag(spec.text, spec.field, impl_->added));
        break;
      case GrammarSpec::Kind::kRegex:
        check_hex_escapes(spec.text, spec.field);
        g = impl_->compiler.CompileRegex(spec.text);
        break;
      case GrammarSpec::Kind::kEbnf:
        check_hex_escapes(spec.text, spec.field);
        g = impl_->compiler.CompileGrammar(spec.text, "root");
        break;
      case GrammarSpec::Kind::kChoice: {
        METRALE_CHECK(!spec.choices.empty(), spec.field, ": the choice list is empty");
        std::string ebnf = "root ::= ";
        for (size_t i = 0; i < spec.choices.size(); ++i) {
          METRALE_CHECK(!spec.choices[i].empty(), spec.field, "[", i, "]: an empty choice");
          ebnf += (i ? " | " : "") + ebnf_literal(spec.choices[i]);
        }
        g = impl_->compiler.CompileGrammar(ebnf, "root");
        break;
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw make_error(spec.field, ": ", engine_message(e.what()));
  }
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*g), impl_->guard);
  // A grammar no token can start (and that does not match the empty output) matches nothing.
  GrammarMatcher probe(compiled);
  std::vector<uint32_t> mask(probe.mask_words());
  probe.fill_mask(mask);
  bool any = std::any_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; });
  METRALE_CHECK(any, spec.field, ": the grammar matches no output over this tokenizer");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->cache.size() >= 256) impl_->cache.clear();
  impl_->cache.emplace(key, compiled);
  return compiled;
}

namespace {

// The mask workers: matchers whose next mask is wanted wait in `queue`; the threads take them
// in turn. One mutex guards the queue and every matcher's fill state, so a matcher's owner
// and a worker never touch its xgrammar state at once: a worker owns it from kQueued (taken
// off the queue) until it sets kReady, and an owner that wants it back first takes a queued
// fill off the queue (to run it itself, or to drop it) or waits for a running one.
enum class Fill : uint8_t { kNone, kQueued, kRunning, kReady };

struct FillJob {
  Fill state = Fill::kNone;  // under MaskWorkers::mu
  bool restricts = false;    // kReady: fill's result (false: every token allowed)
  std::exception_ptr error;  // kReady: what the fill threw
  virtual void run() = 0;    // fills the mask (no lock held)
  virtual ~FillJob() = default;
};

class MaskWorkers {
 public:
  // Null when METRALE_GRAMMAR_THREADS is 0. Started on first use and never stopped (a fill
  // may still be wanted by a matcher destroyed during the process's exit).
  static MaskWorkers* get() {
    static MaskWorkers* const w =
        grammar_mask_threads() > 0 ? new MaskWorkers(grammar_mask_threads()) : nullptr;
    return w;
  }

  void push(FillJob& j) {
    {
      std::lock_guard lock(mu_);
      if (j.state != Fill::kNone) return;
      j.state = Fill::kQueued;
      queue_.push_back(&j);
    }
    work_cv_.notify_one();
  }

  // What settle() does with a fill still queued.
  enum class Queued : uint8_t {
    kRun,   // takes it off the queue and runs it on the calling thread
    kDrop,  // takes it off the queue
    kKeep,  // leaves it queued: no worker starts it while the returned lock is held
  };

  // Gives `j` back to its owner: a running fill is waited for (kRun: while filling other
  // queued masks), a queued one as `how` says. Returns with the lock held (the caller may
  // then read j's results).
  std::unique_lock<std::mutex> settle(FillJob& j, Queued how) {
    std::unique_lock lock(mu_);
    if (j.state == Fill::kQueued && how != Queued::kKeep) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), &j));
      j.state = Fill::kNone;
      if (how == Queued::kRun) {
        j.state = Fill::kRunning;  // (no worker can see it: it is off the queue)
        lock.unlock();
        finish(j);
        lock.lock();
      }
    }
    while (j.state == Fill::kRunning) {
      if (how == Queued::kRun && !queue_.empty()) {
        // The pick waits on a worker: meanwhile it fills the mask wanted last (the rows of
        // a step are picked in the order their fills were queued).
        FillJob& other = *queue_.back();
        queue_.pop_back();
        other.state = Fill::kRunning;
        lock.unlock();
        finish(other);
        lock.lock();
        continue;
      }
      done_cv_.wait(lock);
    }
    return lock;
  }

 private:
  explicit MaskWorkers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
  }

  // Runs j (state kRunning, no lock held), then publishes its result.
  void finish(FillJob& j) {
    std::exception_ptr error;
    try {
      j.run();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      j.error = error;
      j.state = Fill::kReady;
    }
    done_cv_.notify_all();
  }

  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !queue_.empty(); });
      FillJob& j = *queue_.front();
      queue_.pop_front();
      j.state = Fill::kRunning;
      lock.unlock();
      finish(j);
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<FillJob*> queue_;
  std::vector<std::thread> threads_;
};

}  // namespace

struct GrammarMatcher::Impl final : FillJob {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher m;
  int64_t vocab;
  std::vector<uint32_t> mask;  // the prefetched mask (kReady)
  MaskWorkers* workers = MaskWorkers::get();
  // Where the output stands inside a UTF-8 character, and before each accepted token (the
  // rollback's history).
  Utf8State utf8;
  std::vector<Utf8State> utf8_before;
  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : grammar(std::move(g)),
        m(grammar->get()),
        vocab(grammar->get().GetTokenizerInfo().GetVocabSize()),
        mask(static_cast<size_t>(xgrammar::GetBitmaskSize(static_cast<int>(vocab)))) {}
  ~Impl() override { release(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  bool fill(std::span<uint32_t> out) {
    int64_t shape[1] = {static_cast<int64_t>(out.size())};
    DLTensor t{};
    t.data = out.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = shape;
    t.strides = nullptr;
    t.byte_offset = 0;
    bool narrowed = m.FillNextTokenBitmask(&t, 0);
    if (!narrowed && utf8.need > 0) {
      std::fill(out.begin(), out.end(), ~0u);
      narrowed = true;
    }
    if (narrowed) grammar->guard().restrict(utf8, out);
    return narrowed;
  }
  void run() override { restricts = fill(mask); }

  // The matcher back from the workers (a running fill finished, a queued one as `how` says),
  // while the returned lock is held (kKeep) or until the next prefetch().
  std::unique_lock<std::mutex> own(MaskWorkers::Queued how) {
    return workers != nullptr ? workers->settle(*this, how) : std::unique_lock<std::mutex>();
  }
  void release() { own(MaskWorkers::Queued::kDrop); }
  // The matcher is about to move: the prefetched mask is stale.
  void invalidate() {
    auto lock = own(MaskWorkers::Queued::kDrop);
    state = Fill::kNone;
  }
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

int64_t GrammarMatcher::vocab_size() const { return impl_->vocab; }
size_t GrammarMatcher::mask_words() const { return impl_->mask.size(); }

bool GrammarMatcher::fill_mask(std::span<uint32_t> mask) {
  METRALE_CHECK(mask.size() == mask_words(), "grammar mask: ", mask.size(), " words, expected ",
                mask_words());
  impl_->release();
  return impl_->fill(mask);
}

void GrammarMatcher::prefetch() {
  Impl& i = *impl_;
  if (i.workers == nullptr) return;
  {
    // (The owner's thread: no worker holds the matcher unless it is queued or running, and
    // then push() does nothing.)
    auto lock = i.own(MaskWorkers::Queued::kKeep);
    if (i.state != Fill::kNone) return;  // queued, or filled already
  }
  if (i.m.IsTerminated()) return;
  i.workers->push(i);
}

void GrammarMatcher::apply_mask(std::span<float> logits) {
  METRALE_CHECK(static_cast<int64_t>(logits.size()) == impl_->vocab, "grammar mask: a row of ",
                logits.size(), " logits, expected ", impl_->vocab);
  Impl& i = *impl_;
  bool ready = false;
  if (i.workers != nullptr) {
    auto lock = i.own(MaskWorkers::Queued::kRun);
    ready = i.state == Fill::kReady;
    if (ready && i.error) {
      std::exception_ptr e = i.error;
      i.error = nullptr;
      i.state = Fill::kNone;
      std::rethrow_exception(e);
    }
  }
  // (Not kReady: nothing is queued or running, so the matcher is the caller's alone.)
  if (!ready) i.restricts = i.fill(i.mask);
  if (i.restricts) apply_token_mask(i.mask, logits);
}

bool GrammarMatcher::accept(int32_t token) {
  Impl& i = *impl_;
  if (token < 0 || token >= i.vocab) return false;
  i.invalidate();
  const std::optional<Utf8State> next = i.grammar->guard().after(i.utf8, token);
  if (!next || !i.m.AcceptToken(token)) return false;
  i.utf8_before.push_back(i.utf8);
  i.utf8 = *next;
  return true;
}
void GrammarMatcher::rollback(size_t n) {
  if (n == 0) return;
  Impl& i = *impl_;
  METRALE_CHECK(n <= i.utf8_before.size(), "grammar: rolling back ", n, " tokens of ",
                i.utf8_before.size(), " accepted");
  i.invalidate();
  i.m.Rollback(static_cast<int>(n));
  i.utf8 = i.utf8_before[i.utf8_before.size() - n];
  i.utf8_before.resize(i.utf8_before.size() - n);
}
bool GrammarMatcher::terminated() const {
  auto lock = impl_->own(MaskWorkers::Queued::kKeep);
  return impl_->m.IsTerminated();
}
bool GrammarMatcher::completed() const {
  auto lock = impl_->own(MaskWorkers::Queued::kKeep);
  return impl_->m.IsCompleted();
}

#else  // built without xgrammar

bool grammar_available() { return false; }

class CompiledGrammar {};

struct GrammarCompiler::Impl {};

GrammarCompiler::GrammarCompiler(const Tokenizer&, int64_t vocab_size, std::vector<int32_t>)
    : vocab_size_(vocab_size) {}
GrammarCompiler::~GrammarCompiler() = default;
size_t GrammarCompiler::cached() const { return 0; }
std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  throw make_error(spec.field,
                   ": structured outputs are unavailable: this metrale was built without "
                   "xgrammar (scripts/fetch-xgrammar.sh)");
}

struct GrammarMatcher::Impl {};
GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar>) {
  throw Error("grammar: built without xgrammar");
}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;
int64_t GrammarMatcher::vocab_size() const { return 0; }
size_t GrammarMatcher::mask_words() const { return 0; }
bool GrammarMatcher::fill_mask(std::span<uint32_t>) { return false; }
void GrammarMatcher::prefetch() {}
void GrammarMatcher::apply_mask(std::span<float>) {}
bool GrammarMatcher::accept(int32_t) { return false; }
void GrammarMatcher::rollback(size_t) {}
bool GrammarMatcher::terminated() const { return false; }
bool GrammarMatcher::completed() const { return false; }

#endif

}  // namespace metrale
