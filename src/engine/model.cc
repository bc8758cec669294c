#include "engine/model.h"

#include <algorithm>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace metrale {

RopeTableConfig rope_table_config(const ModelConfig& c) {
  const RopeConfig& r = c.rope;
  RopeTableConfig t{.type = r.type,
                    .theta = r.theta,
                    .head_dim = c.head_dim,
                    .partial_rotary_factor = r.partial_rotary_factor,
                    .factor = r.factor,
                    .original_max_position_embeddings = r.original_max_position_embeddings};
  if (r.type == RopeType::kLlama3) {
    t.low_freq_factor = r.low_freq_factor;
    t.high_freq_factor = r.high_freq_factor;
  }
  if (r.type == RopeType::kYarn) {
    t.beta_fast = r.beta_fast;
    t.beta_slow = r.beta_slow;
    t.truncate = r.truncate;
    t.attention_factor = r.attention_factor;  // already derived as HF does by the config parser
  }
  return t;
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const LoadOptions& o) {
  return with_context("loading model " + dir.string(), [&] {
    std::unique_ptr<Model> m(new Model());
    m->dir_ = dir;
    m->config_ = load_model_config(dir.string());
    const ModelConfig& c = m->config_;
    METRALE_CHECK(is_dense_model_type(c.model_type), c.source, ": model_type '", c.model_type,
                  "' parses, but this build runs only llama, mistral, qwen2 and qwen3 models");
    METRALE_CHECK(o.max_rows > 0 && o.page_size > 0, "LoadOptions: max_rows ", o.max_rows,
                  " and page_size ", o.page_size, " must be positive");
    if (o.load_tokenizer && std::filesystem::exists(dir / "tokenizer.json")) {
      m->tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_file((dir / "tokenizer.json").string()));
      METRALE_CHECK(static_cast<int64_t>(m->tokenizer_->id_limit()) <= c.vocab_size,
                    (dir / "tokenizer.json").string(), ": the tokenizer has ids up to ",
                    m->tokenizer_->id_limit() - 1, " but config.json's vocab_size is ", c.vocab_size);
    }
    m->pool_ = std::make_unique<ThreadPool>(o.n_threads > 0 ? o.n_threads : default_thread_count());
    METRALE_CHECK(o.compute == Compute::kF32 || o.placement == WeightPlacement::kCopy,
                  "LoadOptions: compute bf16 repacks the weights and needs placement copy, not in-place (mmap)");
    m->backend_ = std::make_unique<CpuBackend>(*m->pool_, o.compute);
    m->active_ = m->backend_.get();
    m->checkpoint_ = std::make_unique<Checkpoint>(Checkpoint::open(dir));
    m->weights_ = load_dense_weights(c, *m->checkpoint_, *m->backend_, o.placement, o.progress);
    m->weight_bytes_ = m->checkpoint_->total_bytes();
    m->layers_.reserve(static_cast<size_t>(c.n_layers));
    for (int64_t i = 0; i < c.n_layers; ++i) {
      m->layers_.emplace_back(c, m->weights_.layers[static_cast<size_t>(i)], i);
    }

    const int64_t context = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
    const int64_t kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : std::min<int64_t>(context, 4096);
    m->context_ = std::min(context, kv_tokens);
    m->rope_ = RopeTable::build(rope_table_config(c), m->context_);
    const KvLayout layout{.n_pages = (kv_tokens + o.page_size - 1) / o.page_size,
                          .page_size = o.page_size,
                          .n_kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim};
    m->kv_ = std::make_unique<KvPool>(*m->backend_, c.n_layers, layout);

    m->max_rows_ = o.max_rows;
    const int64_t R = o.max_rows, H = c.hidden_size;
    const size_t scratch = dense_scratch_bytes(c, R);
    const size_t resid = static_cast<size_t>(R * H) * sizeof(float);
    m->scratch_buffer_ = m->backend_->allocate(scratch + 2 * resid);
    auto* base = m->scratch_buffer_.as<char>();
    m->scratch_ = dense_scratch_at(base, c, R);
    m->h_ = rows_of(reinterpret_cast<float*>(base + scratch), R, H);
    m->delta_ = rows_of(reinterpret_cast<float*>(base + scratch + resid), R, H);
    m->positions_.resize(static_cast<size_t>(R));
    m->slots_.resize(static_cast<size_t>(R));
    m->tables_.resize(static_cast<size_t>(R));
    return m;
  });
}

Model::~Model() = default;

void Model::check_ids(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    METRALE_CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size, "token id ", ids[i], " at index ", i,
                  " is outside the vocabulary [0, ", config_.vocab_size, ")");
  }
}

void Model::run(const ForwardContext& ctx, std::span<const int32_t> ids, int64_t first_logit_row,
                float* logits, const HiddenSink* sink) {
  Backend& be = *ctx.backend;
  const int64_t n = ctx.n_rows;
  Residual r{.h = {h_.data, n, h_.n_cols, h_.stride}, .delta = {delta_.data, n, delta_.n_cols, delta_.stride}};
  be.embedding(weights_.embed, ids, r.h);
  if (sink != nullptr) (*sink)(0, r.h);
  const DenseScratch s = scratch_.first(n);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const NormStyle style = ships_vanilla_norm_weights(config_) ? NormStyle::kWeight : NormStyle::kOnePlusWeight;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i].forward(ctx, LayerState{kv_->layer(static_cast<int64_t>(i))}, r, s);
    if (sink != nullptr && i + 1 < layers_.size()) {
      // Materialise h for the observer; the next layer's norm then finds nothing pending.
      add_and_norm(be, r, s.x, weights_.final_norm.data(), eps, style);
      (*sink)(static_cast<int64_t>(i + 1), r.h);
    }
  }
  if (logits == nullptr) return;  // a chunk that only fills the cache
  // Only the rows whose logits are wanted go through the final norm and lm_head.
  const int64_t m = n - first_logit_row;
  auto tail = [&](Rows x) { return Rows{x.row(first_logit_row), m, x.n_cols, x.stride}; };
  Residual last{.h = tail(r.h), .delta = tail(r.delta), .pending = r.pending};
  Rows x = tail(s.x);
  add_and_norm(be, last, x, weights_.final_norm.data(), eps, style);
  if (sink != nullptr) (*sink)(static_cast<int64_t>(layers_.size()), x);
  be.linear(x, weights_.lm_head, rows_of(logits, m, config_.vocab_size));
}

void Model::prefill(Sequence& seq, std::span<const int32_t> ids, std::span<float> logits,
                    bool all_logits, const HiddenSink* sink) {
  const auto n = static_cast<int64_t>(ids.size());
  METRALE_CHECK(n > 0, "prefill: no tokens");
  check_ids(ids);
  const auto start = static_cast<int64_t>(seq.tokens.size());
  METRALE_CHECK(start + n <= context_, "a sequence of ", start + n, " tokens (", start,
                " cached + ", n, " new) exceeds the context of ", context_, " tokens");
  const int64_t V = config_.vocab_size;
  const size_t want = static_cast<size_t>((all_logits ? n : 1) * V);
  METRALE_CHECK(logits.size() == want, "prefill: logits buffer holds ", logits.size(),
                " floats, expected ", want);
  METRALE_CHECK(sink == nullptr || n <= max_rows_, "prefill: hidden states are recorded for one chunk",
                " only: ", n, " tokens exceed max_rows ", max_rows_);
  METRALE_CHECK(!requires_single_chunk_prefill(config_) || (start == 0 && n <= max_rows_),
                config_.model_type, " prompts must be prefilled in one chunk of at most ", max_rows_,
                " tokens");
  kv_->reserve(seq.block_table, start + n);
  for (int64_t done = 0; done < n; done += max_rows_) {
    const int64_t rows = std::min(max_rows_, n - done);
    const int64_t pos0 = start + done;
    for (int64_t i = 0; i < rows; ++i) {
      positions_[static_cast<size_t>(i)] = static_cast<int32_t>(pos0 + i);
    }
    tables_[0] = KvPageTable{.block_table = seq.block_table, .seq_len = pos0 + rows};
    for (int64_t i = 0; i < rows; ++i) {
      slots_[static_cast<size_t>(i)] = tables_[0].slot(pos0 + i, kv_->layout().page_size);
    }
    const ForwardContext ctx{.backend = active_,
                             .n_rows = rows,
                             .positions = std::span(positions_).first(static_cast<size_t>(rows)),
                             .slots = std::span(slots_).first(static_cast<size_t>(rows)),
                             .seqs = std::span(tables_).first(1),
                             .prefill = true,
                             .rope = &rope_};
    const bool last_chunk = done + rows == n;
    if (all_logits) {
      run(ctx, ids.subspan(static_cast<size_t>(done), static_cast<size_t>(rows)), 0,
          logits.data() + done * V, sink);
    } else if (last_chunk) {
      run(ctx, ids.subspan(static_cast<size_t>(done), static_cast<size_t>(rows)), rows - 1,
          logits.data(), sink);
    } else {  // earlier chunks only fill the cache: no final norm, no lm_head
      run(ctx, ids.subspan(static_cast<size_t>(done), static_cast<size_t>(rows)), rows, nullptr, nullptr);
    }
    seq.tokens.insert(seq.tokens.end(), ids.begin() + done, ids.begin() + done + rows);
  }
}

void Model::decode(std::span<Sequence* const> seqs, std::span<const int32_t> tokens,
                   std::span<float> logits) {
  const auto n = static_cast<int64_t>(seqs.size());
  METRALE_CHECK(n > 0 && n <= max_rows_, "decode: ", n, " sequences; expected 1..", max_rows_);
  METRALE_CHECK(tokens.size() == seqs.size(), "decode: ", tokens.size(), " tokens for ", n, " sequences");
  METRALE_CHECK(logits.size() == static_cast<size_t>(n * config_.vocab_size), "decode: logits buffer holds ",
                logits.size(), " floats, expected ", n * config_.vocab_size);
  check_ids(tokens);
  for (int64_t i = 0; i < n; ++i) {
    const Sequence& s = *seqs[static_cast<size_t>(i)];
    METRALE_CHECK(static_cast<int64_t>(s.tokens.size()) + 1 <= context_, "decode: sequence ", i, " has ",
                  s.tokens.size(), " tokens; one more exceeds the context of ", context_);
    for (int64_t j = 0; j < i; ++j) {
      METRALE_CHECK(seqs[static_cast<size_t>(j)] != &s, "decode: sequence ", i, " appears twice in one step");
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    Sequence& s = *seqs[static_cast<size_t>(i)];
    const auto pos = static_cast<int64_t>(s.tokens.size());
    kv_->reserve(s.block_table, pos + 1);
    positions_[static_cast<size_t>(i)] = static_cast<int32_t>(pos);
    tables_[static_cast<size_t>(i)] = KvPageTable{.block_table = s.block_table, .seq_len = pos + 1};
    slots_[static_cast<size_t>(i)] = tables_[static_cast<size_t>(i)].slot(pos, kv_->layout().page_size);
  }
  const auto un = static_cast<size_t>(n);
  const ForwardContext ctx{.backend = active_,
                           .n_rows = n,
                           .positions = std::span(positions_).first(un),
                           .slots = std::span(slots_).first(un),
                           .seqs = std::span(tables_).first(un),
                           .prefill = false,
                           .rope = &rope_};
  run(ctx, tokens, 0, logits.data(), nullptr);
  for (int64_t i = 0; i < n; ++i) seqs[static_cast<size_t>(i)]->tokens.push_back(tokens[static_cast<size_t>(i)]);
}

void Model::release(Sequence& seq) {
  kv_->release(seq.block_table);
  seq.tokens.clear();
}

}  // namespace metrale
