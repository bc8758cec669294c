#include "cli/options.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "engine/mtp_proposer.h"
#include "speculative/ngram_proposer.h"

namespace metrale::cli {
namespace {

template <typename T>
std::vector<T> parse_list(const std::string& text, const std::string& flag, T min) {
  std::vector<T> out;
  size_t begin = 0;
  METRALE_CHECK(!text.empty(), flag, ": expected a comma-separated list, found nothing");
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string_view item = std::string_view(text).substr(begin, end - begin);
    T value{};
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    METRALE_CHECK(ec == std::errc() && ptr == item.data() + item.size() && value >= min, flag,
                  ": item ", out.size() + 1, " '", item, "' is not an integer >= ", min);
    out.push_back(value);
    begin = end + 1;
  }
  return out;
}

void draw_progress(uint64_t done, uint64_t total) {
  if (total < (uint64_t{64} << 20)) return;  // small loads finish before a line helps
  static int last = -1;
  const int pct = total ? static_cast<int>(done * 100 / total) : 100;
  if (pct == last) return;
  last = pct;
  std::fprintf(stderr, "\rloading weights: %3d%% (%.1f / %.1f MB)", pct,
               static_cast<double>(done) / 1e6, static_cast<double>(total) / 1e6);
  if (done >= total) std::fputc('\n', stderr);
}

}  // namespace

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag) {
  return parse_list<int32_t>(text, flag, 0);
}
std::vector<int64_t> parse_count_list(const std::string& text, const std::string& flag) {
  return parse_list<int64_t>(text, flag, 1);
}

std::vector<int64_t> parse_list_at_least(const std::string& text, const std::string& flag,
                                         int64_t min) {
  return parse_list<int64_t>(text, flag, min);
}

void ModelFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--model,-m", dir, "checkpoint directory (config.json, *.safetensors)")
      ->required();
  cmd.add_option("--threads,-t", threads, "compute threads (default: METRALE_THREADS or the cores)")
      ->check(CLI::Range(0, 1024));
  cmd.add_option("--kv-tokens", kv_tokens,
                 "KV cache capacity in tokens (default: min(context, 4096))")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd.add_option("--kv-dtype", kv_dtype,
                 "KV cache storage: f32 (exact), f16 or bf16 (half the bytes; attention "
                 "computes in f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd.add_option("--max-rows", max_rows, "largest prefill chunk / decode batch")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  cmd.add_option("--weights", placement,
                 "where decode reads weights: copy (anonymous memory) or mmap")
      ->check(CLI::IsMember({"copy", "mmap"}));
  cmd.add_option("--compute", compute,
                 "linear-layer arithmetic: f32 (HF numerics), bf16 (inputs rounded to bf16, "
                 "as llama.cpp's BF16; needs --weights copy) or int8 (bf16, and int4 / int8 / "
                 "nvfp4 weights meet inputs quantized to int8 per 32, as llama.cpp's Q4_0 / Q8_0)")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd.add_option("--executor", executor,
                 "what runs decode steps: layers (the layer loop, op by op) or circuit (a "
                 "program per batch width 1, 2, 4, ... run in one parallel region; other steps "
                 "run the layer loop)");
  cmd.add_option("--fusion", fusion,
                 "--executor circuit: what the programs fuse: none (the layer loop's exact ops), "
                 "default (all of them) or a comma-separated list of residual (the residual add "
                 "in the o_proj / down_proj epilogue), gate_up (act(gate) * up in the gate|up "
                 "epilogue), norm (RMSNorm in the next linear's input pass)");
  cmd.add_option("--max-seqs", max_seqs,
                 "hybrid models: sequences that hold a recurrent-state slot at once")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  cmd.add_option("--state-dtype", state_dtype,
                 "hybrid models: recurrent-state storage, f32 or f16 (computed in f32)")
      ->check(CLI::IsMember({"f32", "f16"}));
  cmd.add_option("--state-budget", state_budget,
                 "hybrid models: bytes the recurrent-state pool may take (e.g. 2GiB); the "
                 "rollback ring is the deepest of 8, 4, 2, 1, 0 that fits (default: 8)");
}

LoadOptions ModelFlags::load_options() const {
  LoadOptions o;
  o.n_threads = threads;
  o.kv_tokens = kv_tokens;
  o.max_rows = max_rows;
  o.placement = placement == "mmap" ? WeightPlacement::kInPlace : WeightPlacement::kCopy;
  o.compute = compute == "bf16"   ? Compute::kBF16
              : compute == "int8" ? Compute::kInt8
                                  : Compute::kF32;
  o.max_seqs = max_seqs;
  o.executor = parse_executor(executor, "--executor");
  o.fusion = parse_fusion(fusion, "--fusion");
  o.state_dtype = state_dtype == "f16" ? DType::kF16 : DType::kF32;
  o.kv_dtype = kv_dtype == "f16" ? DType::kF16 : kv_dtype == "bf16" ? DType::kBF16 : DType::kF32;
  if (!state_budget.empty()) o.state_budget = parse_byte_size(state_budget, "--state-budget");
  // Progress only where a person watches and the load takes a moment.
  if (isatty(STDERR_FILENO)) o.progress = draw_progress;
  return o;
}

std::unique_ptr<Model> load_model(const ModelFlags& flags) {
  return Model::load(flags.dir, flags.load_options());
}

void LoraFlags::add_to(CLI::App& cmd, bool with_adapter) {
  cmd.add_option("--lora", loras, "NAME=DIR: load a PEFT LoRA adapter (repeatable)");
  if (with_adapter) {
    cmd.add_option("--adapter", adapter,
                   "the adapter to run (a --lora NAME; default: the only one given)");
  }
  cmd.add_option("--lora-max-rank", max_rank,
                 "largest adapter rank a slot holds (default: "
                 "the largest of the adapters given)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  cmd.add_option("--lora-slots", slots, "adapter slots in the pool (default: one per --lora)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  cmd.add_option("--lora-dtype", dtype, "slot storage: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

std::string LoraFlags::apply(Model& model) const {
  METRALE_CHECK(!loras.empty() || adapter.empty(), "--adapter ", adapter,
                ": no --lora NAME=DIR given");
  if (loras.empty()) return "";
  std::vector<std::pair<std::string, std::string>> named;
  for (const std::string& l : loras) {
    const size_t eq = l.find('=');
    METRALE_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < l.size(), "--lora '", l,
                  "': expected NAME=DIR");
    named.emplace_back(l.substr(0, eq), l.substr(eq + 1));
    for (size_t i = 0; i + 1 < named.size(); ++i) {
      METRALE_CHECK(named[i].first != named.back().first, "--lora: the name '", named.back().first,
                    "' is given twice");
    }
  }
  // The pool's max rank: the flag, else the adapters' largest (read from their configs by a
  // first audit pass would double the work; the pool refuses a larger one with a clear error).
  int64_t rank = max_rank;
  if (rank == 0) {
    for (const auto& [name, dir] : named) {
      (void)name;
      rank = std::max(rank, peft_max_rank(dir));
    }
  }
  const auto n = static_cast<int64_t>(named.size());
  METRALE_CHECK(slots == 0 || slots >= n, "--lora-slots ", slots, " is fewer than the ", n,
                " adapters given");
  LoraPool& pool = model.enable_lora({.max_loras = slots > 0 ? slots : n,
                                      .max_rank = rank,
                                      .dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32});
  for (const auto& [name, dir] : named) pool.load(name, dir, /*pinned=*/true);
  if (!adapter.empty()) {
    METRALE_CHECK(pool.loaded(adapter), "--adapter ", adapter, ": no --lora of that name");
    return adapter;
  }
  return n == 1 ? named[0].first : "";
}

void SpeculativeFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--speculative", kind,
                 "speculative decoding: ngram (prompt lookup: drafts copied from the context), "
                 "mtp (the checkpoint's multi-token-prediction layers) or off; greedy output is "
                 "unchanged token for token");
  cmd.add_option("--draft-tokens", draft_tokens, "most draft tokens per sequence per step (K)");
  cmd.add_option("--draft-ladder", ladder,
                 "drafts by batch size: rungs n_max:drafts, e.g. 4:3,8:3,16:1,32:1 (the first "
                 "rung with n_max >= the sequences decoding, else the last; clamped to 1..K, an "
                 "explicit 0: no drafts at that width)");
  cmd.add_option("--draft-tree", tree,
                 "draft a tree per step, verified at once with tree attention: chain:K, or the "
                 "nodes' parents, e.g. -1,-1,0,0,1 (two guesses for the next token, two after the "
                 "first, one after the second); no deeper than --draft-tokens, no more nodes "
                 "than --dispatch-cap (hybrid models: no more than the state ring's depth)");
  cmd.add_option("--draft-branch-p", branch_p,
                 "--speculative mtp with --draft-tree: a runner-up token becomes a branch only "
                 "where the drafter gives it at least this probability (0, the default: every "
                 "node of the shape); fewer verify rows where the drafter is sure");
  cmd.add_option("--dispatch-cap", dispatch_cap,
                 "most draft rows one step adds over all its sequences (1..128)");
  cmd.add_option("--ngram-min", ngram_min,
                 "ngram: the shortest context suffix that may match an earlier occurrence");
  cmd.add_option("--ngram-max", ngram_max, "ngram: the longest suffix tried first");
  cmd.add_option("--drafter-context", context.context,
                 "what the drafter sees: prefill,carry (default), prefill, carry or none");
  cmd.add_option("--drafter-prefill", context.prefill,
                 "1: the drafter is prefilled over the prompt (default); 0: it starts at the "
                 "prompt's last token (--speculative mtp: lower acceptance, no prompt logits, "
                 "nothing carried; also METRALE_DRAFTER_PREFILL)");
  cmd.add_option("--mtp-carry", context.carry,
                 "1: a session's next request adopts its last request's drafter rows (serve, "
                 "--speculative mtp; default 1; also METRALE_MTP_CARRY)");
}

void SpeculativeFlags::check() const {
  METRALE_CHECK(kind == "ngram" || kind == "mtp" || kind == "off", "--speculative '", kind,
                "': expected ngram, mtp or off");
  speculative::check_dispatch_cap(dispatch_cap, draft_tokens);
  drafter_context();
  if (!ladder.empty()) speculative::DraftLadder::parse(ladder, draft_tokens, "--draft-ladder");
  if (!tree.empty()) {
    const speculative::DraftTree t = speculative::DraftTree::parse(tree, "--draft-tree");
    METRALE_CHECK(t.max_depth() <= draft_tokens, "--draft-tree: '", tree, "' is ", t.max_depth(),
                  " drafts deep, deeper than --draft-tokens ", draft_tokens,
                  " (the most one step drafts); raise --draft-tokens");
    METRALE_CHECK(t.size() <= dispatch_cap, "--draft-tree: '", tree, "' has ", t.size(),
                  " nodes, more than --dispatch-cap ", dispatch_cap,
                  " (the draft rows one step adds)");
  }
  METRALE_CHECK(branch_p >= 0 && branch_p < 1,
                "--draft-branch-p: expected a probability in "
                "[0, 1), found ",
                branch_p);
  METRALE_CHECK(branch_p == 0 || (kind == "mtp" && !tree.empty()),
                "--draft-branch-p: applies to --speculative mtp with --draft-tree");
  METRALE_CHECK(ngram_min >= 1 && ngram_min <= speculative::kNgramMaxN, "--ngram-min: expected 1..",
                speculative::kNgramMaxN, ", found ", ngram_min);
  METRALE_CHECK(ngram_max >= ngram_min && ngram_max <= speculative::kNgramMaxN,
                "--ngram-max: expected --ngram-min (", ngram_min, ") .. ", speculative::kNgramMaxN,
                ", found ", ngram_max);
}

speculative::DrafterContext SpeculativeFlags::drafter_context() const {
  const speculative::DrafterContext c =
      speculative::resolve_drafter_context(context, [](const char* name) {
        return std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read once, at startup
      });
  return c;
}

SpeculationOptions SpeculativeFlags::options(Model& model, int64_t streams,
                                             int64_t carry_tokens) const {
  check();
  SpeculationOptions o;
  if (!on()) return o;
  if (kind == "mtp") {
    METRALE_CHECK(model.config().n_mtp_layers > 0, "--speculative mtp: ", model.dir().string(),
                  " has no MTP layers (config.json: num_nextn_predict_layers / "
                  "mtp_num_hidden_layers is 0 or absent); use --speculative ngram");
    o.proposer = MtpProposer::load(
        model, {.kv_tokens = mtp_kv_tokens(model, streams, max_drafts()) + carry_tokens,
                .kv_dtype = model.kv_pool().layout().dtype,
                .branch_min_prob = branch_p});
  } else {
    o.proposer = std::make_shared<speculative::NgramProposer>(
        speculative::NgramOptions{.min_n = ngram_min, .max_n = ngram_max});
  }
  o.ladder = ladder.empty()
                 ? speculative::DraftLadder::constant(draft_tokens)
                 : speculative::DraftLadder::parse(ladder, draft_tokens, "--draft-ladder");
  o.dispatch_cap = dispatch_cap;
  o.drafter_prefill = drafter_context().prefill;
  if (!tree.empty()) o.tree = speculative::DraftTree::parse(tree, "--draft-tree");
  return o;
}

int64_t SpeculativeFlags::max_drafts() const {
  return tree.empty()
             ? draft_tokens
             : std::max(draft_tokens, speculative::DraftTree::parse(tree, "--draft-tree").size());
}

}  // namespace metrale::cli
