#include "engine/model.h"

#include "io/config/vision_config.h"

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/factory/backend_factory.h"
#include "core/error.h"
#include "models/registry.h"

namespace metrale {

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const LoadOptions& o) {
  return with_context("loading model " + dir.string(), [&] {
    std::unique_ptr<Model> m(new Model());
    m->dir_ = dir;
    m->config_ = load_model_config(dir.string());
    const ModelConfig& c = m->config_;
    const ArchitectureEntry* family = find_architecture(c.model_type);
    if (family == nullptr) {
      std::string known;
      for (const ArchitectureEntry& e : architectures())
        known += (known.empty() ? "" : ", ") + std::string(e.model_type);
      throw make_error(c.source, ": model_type '", c.model_type,
                       "' parses, but this build runs only ", known);
    }
    METRALE_CHECK(o.max_rows > 0 && o.page_size > 0, "LoadOptions: max_rows ", o.max_rows,
                  " and page_size ", o.page_size, " must be positive");
    if (o.load_tokenizer && std::filesystem::exists(dir / "tokenizer.json")) {
      m->tokenizer_ =
          std::make_unique<Tokenizer>(Tokenizer::from_file((dir / "tokenizer.json").string()));
      METRALE_CHECK(static_cast<int64_t>(m->tokenizer_->id_limit()) <= c.vocab_size,
                    (dir / "tokenizer.json").string(), ": the tokenizer has ids up to ",
                    m->tokenizer_->id_limit() - 1, " but config.json's vocab_size is ",
                    c.vocab_size);
    }
    m->pool_ = std::make_unique<ThreadPool>(o.n_threads > 0 ? o.n_threads : default_thread_count());
    METRALE_CHECK(o.compute == Compute::kF32 || o.placement == WeightPlacement::kCopy,
                  "LoadOptions: compute bf16 / int8 repacks the weights and needs placement copy, "
                  "not in-place (mmap)");
    m->backend_ = make_backend({.device = o.device, .pool = m->pool_.get(), .compute = o.compute});
    m->checkpoint_ = std::make_unique<Checkpoint>(Checkpoint::open(dir));
    {
      const QuantConfig quant = QuantConfig::parse(c.quantization_config_json, dir);
      TensorLoader loader(*m->checkpoint_, *m->backend_, o.placement, o.progress);
      loader.set_quant_config(&quant);
      m->arch_ = family->build(c, loader);
      m->quant_method_ = quant.method();
      m->linear_report_ = loader.module_report();
      // The towers built so far; the others' tensors stay recognised and unloaded (and their
      // vision_config unread, so a language model that loaded before still loads).
      const std::optional<VisionTowerKind> kind = vision_tower_kind(c.model_type);
      if (kind.has_value()) {
        const VisionConfig vc = load_vision_config(dir.string());
        const std::string prefix = m->checkpoint_->find("visual.patch_embed.proj.weight") != nullptr
                                       ? "visual."
                                       : "model.visual.";
        TensorLoader tower(*m->checkpoint_, *m->backend_, o.placement, nullptr);
        tower.set_quant_config(&quant);
        m->vision_ = VisionEncoder::load(vc, tower, *m->backend_, prefix, o.max_image_patches);
        // Every tensor of the tower's subtree was read (the rest is the language model's).
        for (const CheckpointTensor& t : m->checkpoint_->tensors()) {
          if (!t.name().starts_with(prefix)) tower.ignore(std::string(t.name()));
        }
        tower.check_all_claimed();
        // Qwen3-VL: the tower's deepstack features are added after the first layers.
        m->arch_->deepstack = static_cast<int64_t>(vc.deepstack_visual_indexes.size());
        METRALE_CHECK(m->arch_->deepstack <= static_cast<int64_t>(m->arch_->layers.size()),
                      vc.source, ": ", m->arch_->deepstack,
                      " deepstack mergers for a language model of ", m->arch_->layers.size(),
                      " layers");
      }
    }
    m->weight_bytes_ = m->checkpoint_->total_bytes();

    const int64_t context = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
    const int64_t kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : std::min<int64_t>(context, 4096);
    m->context_ = std::min(context, kv_tokens);
    m->rope_ = RopeTable::build(rope_table_config(c), m->context_);
    // `metrale inspect` reports the KV sizes from the config alone; the layers must agree.
    const std::vector<KvShape> kv = kv_shapes(c);
    for (size_t i = 0; i < m->arch_->layers.size(); ++i) {
      const KvShape got = m->arch_->layers[i].mixer().kv_shape();
      METRALE_CHECK(i < kv.size() && got.n_kv_heads == kv[i].n_kv_heads &&
                        got.head_dim == kv[i].head_dim && got.keys_only == kv[i].keys_only,
                    "layer ", i, " keeps ", got.elems_per_token(),
                    " KV values per token; the config implies ",
                    i < kv.size() ? kv[i].elems_per_token() : 0);
    }
    m->kv_ = std::make_unique<KvPool>(*m->backend_, (kv_tokens + o.page_size - 1) / o.page_size,
                                      o.page_size, kv, o.kv_dtype);
    std::vector<LayerStateShape> shapes;
    bool any_state = false;
    for (const DecoderLayer& layer : m->arch_->layers) {
      shapes.push_back(layer.mixer().state_shape());
      any_state = any_state || !shapes.back().empty();
    }
    if (any_state) {
      // `metrale inspect` plans from the config alone; the layers built must agree with it.
      const std::vector<LayerStateShape> expected = linear_state_shapes(c);
      for (size_t i = 0; i < shapes.size(); ++i) {
        METRALE_CHECK(i < expected.size() && shapes[i].conv_elems == expected[i].conv_elems &&
                          shapes[i].ssm_elems == expected[i].ssm_elems,
                      "layer ", i, " keeps a recurrent state of ", shapes[i].conv_elems, " + ",
                      shapes[i].ssm_elems, " elements; the config implies ",
                      i < expected.size() ? expected[i].conv_elems : 0, " + ",
                      i < expected.size() ? expected[i].ssm_elems : 0);
      }
      StateLayout state_layout = layout_states(shapes, o.state_dtype);
      const StateReservePlan plan = plan_state_reserve({.max_seqs = o.max_seqs,
                                                        .block_bytes = state_layout.block_bytes,
                                                        .snapshot_slots = o.state_snapshots,
                                                        .budget = o.state_budget,
                                                        .ring_depth = o.state_ring_depth});
      m->state_ = std::make_unique<StatePool>(*m->backend_, plan, std::move(state_layout));
    }

    m->max_rows_ = o.max_rows;
    m->executor_ = o.executor;
    m->fusion_ = o.fusion;
    const int64_t R = o.max_rows, H = c.hidden_size;
    const size_t resid = static_cast<size_t>(R * padded_cols(H));
    m->pass_buffer_ = m->backend_->allocate(2 * resid * sizeof(float));
    auto* base = m->pass_buffer_.as<float>();
    m->h_ = {base, R, H, padded_cols(H)};
    m->delta_ = {base + resid, R, H, padded_cols(H)};
    const auto rope = m->rope_.cache();
    const auto rope_values = static_cast<size_t>(rope.n_positions * rope.rotary_dim / 2);
    m->rope_cos_ = DeviceFloats(*m->backend_, {rope.cos, rope_values});
    m->rope_sin_ = DeviceFloats(*m->backend_, {rope.sin, rope_values});
    if (!c.rope.mrope_section.empty()) {
      const auto half = static_cast<int64_t>(m->rope_.inv_freq().size());
      const std::vector<int64_t>& sec = c.rope.mrope_section;
      METRALE_CHECK(c.rope.mrope_interleaved || sec[0] + sec[1] + sec[2] == half, c.source,
                    ": mrope_section ", sec[0], " + ", sec[1], " + ", sec[2],
                    " does not cover the rope's ", half, " frequencies");
      m->mrope_inv_freq_ = DeviceFloats(*m->backend_, m->rope_.inv_freq());
      m->mrope_axes_ =
          DeviceArray<int32_t>(*m->backend_, mrope_axes(sec, c.rope.mrope_interleaved, half));
      m->mrope_ = {.inv_freq = m->mrope_inv_freq_.data(),
                   .axes = m->mrope_axes_.data(),
                   .half = half,
                   .scaling = m->rope_.attention_scaling()};
    }
    // [embedding | deepstack features] per injected row (Architecture::injected_cols()).
    m->injected_stride_ = padded_cols(m->arch_->injected_cols());
    m->injected_ =
        m->backend_->allocate(static_cast<size_t>(R * m->injected_stride_) * sizeof(float));
    for (int64_t i = 0; i < static_cast<int64_t>(m->arch_->layers.size()); ++i) {
      m->kv_views_.push_back(m->kv_->layer(i));
      if (m->state_ != nullptr) {
        const StateLayout::Layer& at = m->state_->layout().layers[static_cast<size_t>(i)];
        m->state_offsets_.push_back(
            {.has_state = at.has_state, .conv = at.conv_offset, .ssm = at.ssm_offset});
      }
    }
    m->record_graphs();
    const auto ur = static_cast<size_t>(R);
    m->ids_.resize(ur);
    m->positions_.resize(ur);
    m->row_seq_.resize(ur);
    m->lora_slots_.resize(ur);
    m->want_.resize(ur);
    m->want_slots_.resize(ur);
    m->positions3_.resize(3 * ur);
    m->injected_rows_.resize(ur);
    m->pool_rows_.resize(ur);
    m->pool_offsets_.resize(ur + 1);
    m->row_index_.resize(ur);
    for (size_t i = 0; i < ur; ++i) m->row_index_[i] = static_cast<int32_t>(i);
    m->slots_.resize(ur);
    m->tree_rows_.resize(ur);
    m->tree_keys_.resize(ur * (ur + 1) / 2);
    m->tree_depth_.resize(ur);
    m->tables_.resize(ur);
    m->items_.resize(ur);
    m->state_runs_.resize(ur);
    m->state_out_.resize(ur);
    return m;
  });
}

Model::~Model() = default;

void Model::check_multimodal(const StepItem& it, size_t index) const {
  const size_t len = it.ids.size();
  if (!multimodal_rope()) {
    METRALE_CHECK(it.positions3.empty() && it.seq->rope_delta == 0, "step: item ", index,
                  " gives multimodal (t, h, w) positions, but ", config_.model_type,
                  "'s rope is 1-D");
  } else {
    METRALE_CHECK(it.positions3.empty() || it.positions3.size() == 3 * len, "step: item ", index,
                  " has ", it.positions3.size(), " (t, h, w) position values for ", len,
                  " tokens; expected ", 3 * len);
    const int64_t lowest = static_cast<int64_t>(it.seq->tokens.size()) + it.seq->rope_delta;
    METRALE_CHECK(!it.positions3.empty() || lowest >= 0, "step: item ", index, ": rope delta ",
                  it.seq->rope_delta, " makes position ", lowest, " negative");
  }
  METRALE_CHECK(it.embed_rows.size() == static_cast<size_t>(it.embeds.n_rows), "step: item ", index,
                " injects ", it.embeds.n_rows, " embedding rows at ", it.embed_rows.size(),
                " places");
  METRALE_CHECK(it.embed_rows.empty() || it.embeds.n_cols == injected_cols(), "step: item ", index,
                "'s injected embeddings are ", it.embeds.n_cols, " wide; the model takes ",
                injected_cols(), " (hidden size ", config_.hidden_size, ", ", arch_->deepstack,
                " deepstack features)");
  for (size_t k = 0; k < it.embed_rows.size(); ++k) {
    METRALE_CHECK(it.embed_rows[k] >= 0 && static_cast<size_t>(it.embed_rows[k]) < len &&
                      (k == 0 || it.embed_rows[k] > it.embed_rows[k - 1]),
                  "step: item ", index, ": injected row ", it.embed_rows[k], " (entry ", k,
                  ") must be ascending within its ", len, " tokens");
  }
}

void Model::check_tree(const StepItem& it, size_t index) const {
  METRALE_CHECK(
      state_ == nullptr || static_cast<int64_t>(it.ids.size()) <= state_->plan().ring_depth + 1,
      "step: item ", index, " is a draft tree of ", it.ids.size(), " rows, but ",
      config_.model_type, "'s state ring keeps ",
      state_ == nullptr ? 0 : state_->plan().ring_depth + 1,
      " (each row's recurrent state is kept for the path verification picks)");
  METRALE_CHECK(it.embed_rows.empty() && it.positions3.empty(), "step: item ", index,
                " is a draft tree with multimodal rows; a tree takes token rows only");
  METRALE_CHECK(it.tree.size() == it.ids.size(), "step: item ", index, " has ", it.tree.size(),
                " tree parents for ", it.ids.size(), " rows");
  for (size_t j = 0; j < it.tree.size(); ++j) {
    const int32_t p = it.tree[j];
    METRALE_CHECK(j == 0 ? p == -1 : p >= 0 && static_cast<size_t>(p) < j, "step: item ", index,
                  ": tree row ", j, " has parent ", p, "; expected ",
                  j == 0 ? "-1 (the root)" : "an earlier row");
  }
}

void Model::check_ids(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    METRALE_CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size, "token id ", ids[i], " at index ", i,
                  " is outside the vocabulary [0, ", config_.vocab_size, ")");
  }
}

void Model::record_graphs() {
  for (const bool observe : {false, true}) {
    Pass& p = observe ? observed_ : plain_;
    p.executor.reset();
    p.graph = Graph();
    p.io = arch_->record(p.graph,
                         {.observe = observe, .mrope = multimodal_rope() ? &mrope_ : nullptr});
    p.plan = plan_graph(p.graph, max_rows_);
  }
  arena_ = backend_->allocate(
      std::max<size_t>({plain_.plan.arena_bytes, observed_.plan.arena_bytes, size_t{64}}));
  for (Pass* p : {&plain_, &observed_})
    p->executor = std::make_unique<Executor>(p->graph, p->plan, arena_.data());
  programs_.clear();
  auto* cpu = dynamic_cast<CpuBackend*>(backend_.get());
  if (executor_ != ExecutorKind::kCircuit || cpu == nullptr) return;
  // The programs read the residual stream where every step binds it.
  Executor& e = *plain_.executor;
  e.bind(plain_.io.h, h_.data, h_.stride);
  e.bind(plain_.io.delta, delta_.data, delta_.stride);
  e.bind(plain_.io.injected, injected_.as<float>(), h_.stride);
  for (int64_t width = 1; width <= max_rows_; width *= 2) {
    programs_.push_back(std::make_unique<Program>(plain_.graph, plain_.plan, e, *cpu, width,
                                                  ProgramIo{.logits = plain_.io.logits}, fusion_));
  }
}

void Model::run(const PassInputs& in, float* logits, float* pooled, const HiddenSink* sink) {
  Pass& p = sink != nullptr ? observed_ : plain_;
  p.executor->bind(p.io.h, h_.data, h_.stride);
  p.executor->bind(p.io.delta, delta_.data, delta_.stride);
  p.executor->bind(p.io.injected, injected_.as<float>(), injected_stride_);
  if (in.n_wanted > 0) p.executor->bind(p.io.logits, logits, config_.vocab_size);
  if (in.n_pools > 0) p.executor->bind(p.io.pooled, pooled, config_.hidden_size);
  if (sink == nullptr) {
    for (const std::unique_ptr<Program>& program : programs_) {
      if (program->stats().width != in.n_rows) continue;
      if (!program->accepts(in)) break;
      program->run(in, logits, config_.vocab_size);
      ++circuit_steps_;
      return;
    }
    ++layer_steps_;
    p.executor->run(*backend_, in);
    return;
  }
  ++layer_steps_;
  const PassObserver observer = [sink](int32_t index, ConstRows rows) { (*sink)(index, rows); };
  PassInputs observed = in;
  observed.observer = &observer;
  p.executor->run(*backend_, observed);
}

void Model::step(std::span<const StepItem> items, std::span<float> logits, const HiddenSink* sink,
                 std::span<float> pooled) {
  METRALE_CHECK(!items.empty(), "step: no sequences");
  int64_t n = 0, n_want = 0, n_pools = 0;
  bool any_tree = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    METRALE_CHECK(it.seq != nullptr, "step: item ", i, " has no sequence");
    METRALE_CHECK(!it.ids.empty(), "step: item ", i, " has no tokens");
    for (size_t j = 0; j < i; ++j) {
      METRALE_CHECK(items[j].seq != it.seq, "step: sequence ", i, " appears twice in one step");
    }
    const auto len = static_cast<int64_t>(it.ids.size());
    const auto have = static_cast<int64_t>(it.seq->tokens.size());
    METRALE_CHECK(have + len <= context_, "a sequence of ", have + len, " tokens (", have,
                  " cached + ", len, " new) exceeds the context of ", context_, " tokens");
    check_ids(it.ids);
    check_multimodal(it, i);
    if (!it.seq->lora.base()) {
      METRALE_CHECK(lora_ != nullptr, "step: sequence ", i, " names LoRA slot ", it.seq->lora.slot,
                    " but the model has no LoRA pool");
      lora_->check(it.seq->lora);
    }
    METRALE_CHECK(it.pool == PoolRows::kNone || it.logits == LogitRows::kNone, "step: item ", i,
                  " pools its rows and wants logits too; an item does one or the other");
    if (!it.tree.empty()) {
      check_tree(it, i);
      any_tree = true;
    }
    n += len;
    n_want += it.logits == LogitRows::kAll ? len : it.logits == LogitRows::kLast ? 1 : 0;
    n_pools += it.pool != PoolRows::kNone ? 1 : 0;
  }
  METRALE_CHECK(n <= max_rows_, "step: ", n, " tokens exceed max_rows ", max_rows_);
  METRALE_CHECK(n_want == 0 || arch_->has_head(), dir_.string(),
                ": the checkpoint has no lm_head (a base model saved without its head, as "
                "sentence-transformers saves embedding models): it embeds but gives no logits");
  METRALE_CHECK(logits.size() == static_cast<size_t>(n_want * config_.vocab_size),
                "step: logits buffer holds ", logits.size(), " floats, expected ",
                n_want * config_.vocab_size);
  METRALE_CHECK(pooled.size() == static_cast<size_t>(n_pools * config_.hidden_size),
                "step: pooled buffer holds ", pooled.size(), " floats, expected ",
                n_pools * config_.hidden_size, " (", n_pools, " pooling items)");
  if (state_ != nullptr) bind_states(items);
  const int64_t page = kv_->layout().page_size;
  for (const StepItem& it : items) {
    // Copy-on-write: the first new token lands inside a page other holders (the prefix
    // cache, a sequence that adopted it) still read; this sequence writes into a copy.
    const auto have = static_cast<int64_t>(it.seq->tokens.size());
    if (have % page != 0) kv_->unshare(it.seq->block_table, have / page);
    kv_->reserve(it.seq->block_table, have + static_cast<int64_t>(it.ids.size()));
  }
  int64_t row = 0, w = 0, n_injected = 0, n_pool_rows = 0, pools = 0, n_tree_keys = 0;
  pool_offsets_[0] = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    const auto start = static_cast<int64_t>(it.seq->tokens.size());
    const auto len = static_cast<int64_t>(it.ids.size());
    tables_[i] = KvPageTable{.block_table = it.seq->block_table, .seq_len = start + len};
    for (size_t k = 0; k < it.embed_rows.size(); ++k, ++n_injected) {
      injected_rows_[static_cast<size_t>(n_injected)] =
          static_cast<int32_t>(row + it.embed_rows[k]);
      backend_->upload(injected_.as<float>() + n_injected * injected_stride_,
                       it.embeds.row(static_cast<int64_t>(k)),
                       static_cast<size_t>(injected_cols()) * sizeof(float));
    }
    for (int64_t j = 0; j < len; ++j, ++row) {
      const auto ur = static_cast<size_t>(row);
      ids_[ur] = it.ids[static_cast<size_t>(j)];
      // A tree row sits at its depth below the root; its K/V is still stored at start + j.
      int64_t pos = start + j;
      if (!it.tree.empty()) {
        const int32_t parent = it.tree[static_cast<size_t>(j)];
        const int32_t depth = parent < 0 ? 0 : tree_depth_[static_cast<size_t>(parent)] + 1;
        tree_depth_[static_cast<size_t>(j)] = depth;
        pos = start + depth;
      }
      positions_[ur] = static_cast<int32_t>(pos);
      if (any_tree) {
        tree_rows_[ur] = {.root = static_cast<int32_t>(pos), .begin = 0};
        if (!it.tree.empty() && pos != start + j) {
          // The row's keys past the root: its ancestors (root-down), then itself.
          const auto d = static_cast<size_t>(pos - start);
          int32_t* keys = tree_keys_.data() + n_tree_keys;
          for (int64_t a = j, k = static_cast<int64_t>(d) - 1; a > 0;
               a = it.tree[static_cast<size_t>(a)], --k) {
            keys[k] = static_cast<int32_t>(start + a);
          }
          tree_rows_[ur] = {.root = static_cast<int32_t>(start),
                            .begin = static_cast<int32_t>(n_tree_keys)};
          n_tree_keys += static_cast<int64_t>(d);
        }
      }
      if (multimodal_rope()) {
        for (size_t a = 0; a < 3; ++a) {
          positions3_[3 * ur + a] = it.positions3.empty()
                                        ? static_cast<int32_t>(pos + it.seq->rope_delta)
                                        : it.positions3[static_cast<size_t>(3 * j) + a];
        }
      }
      row_seq_[ur] = static_cast<int32_t>(i);
      lora_slots_[ur] = it.seq->lora.slot;
      slots_[ur] = tables_[i].slot(start + j, page);
      if (it.logits == LogitRows::kAll || (it.logits == LogitRows::kLast && j == len - 1)) {
        want_slots_[static_cast<size_t>(w)] = it.seq->lora.slot;
        want_[static_cast<size_t>(w++)] = static_cast<int32_t>(row);
      }
      if (it.pool == PoolRows::kAll || (it.pool == PoolRows::kFirst && j == 0) ||
          (it.pool == PoolRows::kLast && j == len - 1)) {
        pool_rows_[static_cast<size_t>(n_pool_rows++)] = static_cast<int32_t>(row);
      }
    }
    if (it.pool != PoolRows::kNone)
      pool_offsets_[static_cast<size_t>(++pools)] = static_cast<int32_t>(n_pool_rows);
  }
  const auto un = static_cast<size_t>(n);
  bool any_lora = false;
  for (const StepItem& it : items) {
    if (it.seq->lora.base()) continue;
    any_lora = true;
    lora_->touch(it.seq->lora);
  }
  const auto uw = static_cast<size_t>(n_want);
  const PassInputs in{
      .n_rows = n,
      .n_wanted = n_want,
      .ids = std::span(ids_).first(un),
      .positions = std::span(positions_).first(un),
      .positions3 = multimodal_rope() ? std::span<const int32_t>(positions3_).first(3 * un)
                                      : std::span<const int32_t>(),
      .row_index = std::span(row_index_).first(un),
      .n_injected = n_injected,
      .injected_rows = std::span(injected_rows_).first(static_cast<size_t>(n_injected)),
      .row_seq = std::span(row_seq_).first(un),
      .slots = std::span(slots_).first(un),
      .tree = any_tree
                  ? KeyRemap{.rows = std::span(tree_rows_).first(un),
                             .keys = std::span(tree_keys_).first(static_cast<size_t>(n_tree_keys))}
                  : KeyRemap{},
      .lora_slots =
          any_lora ? std::span<const int32_t>(lora_slots_).first(un) : std::span<const int32_t>(),
      .wanted = std::span(want_).first(uw),
      .wanted_lora_slots =
          any_lora ? std::span<const int32_t>(want_slots_).first(uw) : std::span<const int32_t>(),
      .n_pool_rows = n_pool_rows,
      .n_pools = n_pools,
      .pool_rows = std::span(pool_rows_).first(static_cast<size_t>(n_pool_rows)),
      .pool_offsets = std::span(pool_offsets_).first(static_cast<size_t>(n_pools + 1)),
      .seqs = std::span(tables_).first(items.size()),
      .rope = {rope_cos_.data(), rope_sin_.data(), rope_.rotary_dim(), rope_.max_positions()},
      .kv = kv_views_,
      .state_runs = std::span<const StateRun>(state_runs_.data(), items.size()),
      .state = state_offsets_,
      .state_dtype = state_ != nullptr ? state_->layout().dtype : DType::kF32,
      .embed_overlays = any_lora && lora_->has_embedding_overlays(),
      .head_overlays = any_lora && lora_->has_head_overlays()};
  run(in, logits.data(), pooled.data(), sink);
  for (const StepItem& it : items) {
    const auto have = static_cast<int64_t>(it.seq->tokens.size());
    const auto len = static_cast<int64_t>(it.ids.size());
    it.seq->tokens.insert(it.seq->tokens.end(), it.ids.begin(), it.ids.end());
    if (state_ != nullptr) {
      // What the ring still holds (state_pool.h): after a step that kept every row's state,
      // the last ring_depth token counts; after a longer one, only its final state.
      const int64_t depth = state_->plan().ring_depth;
      it.seq->state_floor =
          len <= depth + 1 ? std::max(it.seq->state_floor, have + len - depth) : have + len;
      // A tree's rows are not one chain: no count past its root is a state truncate() may
      // take; compact() keeps a path.
      it.seq->tree_start = it.tree.empty() ? -1 : have;
      if (!it.tree.empty()) it.seq->state_floor = have + len;
    }
  }
}

void Model::bind_states(std::span<const StepItem> items) {
  const int64_t depth = state_->plan().ring_depth, versions = depth + 1;
  // Each sequence's slot (a fresh sequence takes one), and no slot twice.
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& seq = *items[i].seq;
    if (seq.state_slot < 0) {
      METRALE_CHECK(seq.tokens.empty(), "step: sequence ", i, " has ", seq.tokens.size(),
                    " tokens but no state slot (was it copied from another Sequence?)");
      seq.state_slot = state_->acquire(&seq);
      seq.state_floor = 0;
    } else {
      state_->check_owner(seq.state_slot, &seq);
    }
  }
  size_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Sequence& seq = *items[i].seq;
    const auto have = static_cast<int64_t>(seq.tokens.size());
    const auto len = static_cast<int64_t>(items[i].ids.size());
    // Token count t's state lives in version t % versions. A step of at most ring_depth + 1
    // rows keeps the state after each row (a verify of up to ring_depth drafts, rolled back to
    // any count after its first row; with ring_depth + 1 rows the last overwrites the state
    // before the step, which no rollback of a verify needs); a longer one keeps only its last,
    // which lets the backend use the chunked form.
    const bool keep_all = len <= depth + 1;
    for (int64_t j = 0; j < len; ++j) {
      const bool keep = keep_all || j == len - 1;
      state_out_[row + static_cast<size_t>(j)] =
          keep ? state_->block(seq.state_slot, (have + j + 1) % versions) : nullptr;
    }
    state_runs_[i] = {
        .in = state_->block(seq.state_slot, have % versions),
        .out = std::span<std::byte* const>(state_out_.data() + row, static_cast<size_t>(len)),
        .parent = items[i].tree};
    row += static_cast<size_t>(len);
  }
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
  METRALE_CHECK(sink == nullptr || n <= max_rows_,
                "prefill: hidden states are recorded for one chunk", " only: ", n,
                " tokens exceed max_rows ", max_rows_);
  METRALE_CHECK(!requires_single_chunk_prefill(config_) || (start == 0 && n <= max_rows_),
                config_.model_type, " prompts must be prefilled in one chunk of at most ",
                max_rows_, " tokens");
  for (int64_t done = 0; done < n; done += max_rows_) {
    const int64_t rows = std::min(max_rows_, n - done);
    const bool last_chunk = done + rows == n;
    const StepItem item{.seq = &seq,
                        .ids = ids.subspan(static_cast<size_t>(done), static_cast<size_t>(rows)),
                        .logits = all_logits   ? LogitRows::kAll
                                  : last_chunk ? LogitRows::kLast
                                               : LogitRows::kNone};
    std::span<float> out =
        all_logits   ? logits.subspan(static_cast<size_t>(done * V), static_cast<size_t>(rows * V))
        : last_chunk ? logits
                     : std::span<float>();
    step({&item, 1}, out, sink);
  }
}

void Model::decode(std::span<Sequence* const> seqs, std::span<const int32_t> tokens,
                   std::span<float> logits) {
  const auto n = static_cast<int64_t>(seqs.size());
  METRALE_CHECK(n > 0 && n <= max_rows_, "decode: ", n, " sequences; expected 1..", max_rows_);
  METRALE_CHECK(tokens.size() == seqs.size(), "decode: ", tokens.size(), " tokens for ", n,
                " sequences");
  METRALE_CHECK(logits.size() == static_cast<size_t>(n * config_.vocab_size),
                "decode: logits buffer holds ", logits.size(), " floats, expected ",
                n * config_.vocab_size);
  for (size_t i = 0; i < seqs.size(); ++i) {
    METRALE_CHECK(seqs[i] != nullptr, "decode: sequence ", i, " is null");
    items_[i] = {.seq = seqs[i], .ids = tokens.subspan(i, 1), .logits = LogitRows::kLast};
  }
  step(std::span(items_).first(seqs.size()), logits);
}

void Model::truncate(Sequence& seq, int64_t n) {
  const auto have = static_cast<int64_t>(seq.tokens.size());
  METRALE_CHECK(n >= 0 && n <= have, "truncate: keep ", n, " tokens of a sequence of ", have);
  if (state_ != nullptr && seq.state_slot >= 0) {
    state_->check_owner(seq.state_slot, &seq);
    if (n == 0) {  // the empty sequence's state is known: zero
      state_->zero_block(state_->block(seq.state_slot, 0));
      seq.state_floor = 0;
      seq.tree_start = -1;
    }
    METRALE_CHECK(n >= seq.state_floor, "truncate: keep ", n, " of ", have,
                  " tokens, but the recurrent state is held back to ", seq.state_floor,
                  " tokens only (rollback ring depth ", state_->plan().ring_depth,
                  "; a step of more tokens keeps only its final state)");
  }
  kv_->truncate(seq.block_table, n);
  seq.tokens.resize(static_cast<size_t>(n));
}

void Model::compact(Sequence& seq, int64_t keep, std::span<const int64_t> rows) {
  const auto have = static_cast<int64_t>(seq.tokens.size());
  const bool hybrid = state_ != nullptr && seq.state_slot >= 0;
  METRALE_CHECK(!hybrid || rows.empty() || (seq.tree_start >= 0 && keep == seq.tree_start + 1),
                "compact: ", config_.model_type,
                "'s recurrent state can skip tokens only right "
                "after a draft tree's step, keeping its root (token ",
                seq.tree_start, "); keep ", keep);
  METRALE_CHECK(keep >= 0 && keep <= have, "compact: keep ", keep, " tokens of a sequence of ",
                have);
  for (size_t i = 0; i < rows.size(); ++i) {
    METRALE_CHECK(rows[i] >= keep + static_cast<int64_t>(i) && rows[i] < have &&
                      (i == 0 || rows[i] > rows[i - 1]),
                  "compact: row ", i, " is token ", rows[i], "; expected ascending tokens in [",
                  keep, ", ", have, ")");
  }
  if (hybrid && seq.tree_start >= 0 && keep == seq.tree_start + 1) {
    // The state after the path's last row (token count rows.back() + 1, or the root's) is the
    // sequence's: into the version of the count it keeps.
    const int64_t versions = state_->plan().ring_depth + 1;
    const int64_t from = rows.empty() ? keep : rows.back() + 1;
    const int64_t to = keep + static_cast<int64_t>(rows.size());
    if (from % versions != to % versions) {
      backend_->copy(state_->block(seq.state_slot, to % versions),
                     state_->block(seq.state_slot, from % versions), state_->plan().block_bytes);
    }
    seq.state_floor = to;
    seq.tree_start = -1;
  }
  const int64_t page = kv_->page_size();
  // A page the moves write into may be shared (the prefix cache): write into a copy.
  int64_t unshared = -1;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t to = keep + static_cast<int64_t>(i);
    if (rows[i] == to || to / page == unshared) continue;
    unshared = to / page;
    kv_->unshare(seq.block_table, unshared);
  }
  move_from_.clear();
  move_to_.clear();
  const KvPageTable table{.block_table = seq.block_table, .seq_len = have};
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t to = keep + static_cast<int64_t>(i);
    seq.tokens[static_cast<size_t>(to)] = seq.tokens[static_cast<size_t>(rows[i])];
    if (rows[i] == to) continue;
    move_from_.push_back(table.slot(rows[i], page));
    move_to_.push_back(table.slot(to, page));
  }
  // Moves in ascending order never read what an earlier one wrote: row i's source lies past
  // every earlier destination.
  if (!move_from_.empty()) {
    for (const KvLayerView& l : kv_views_) {
      if (l.k == nullptr) continue;  // a layer that keeps nothing
      backend_->kv_move({.cache = l, .from = move_from_, .to = move_to_});
    }
  }
  truncate(seq, keep + static_cast<int64_t>(rows.size()));
}

void Model::adopt_prefix(Sequence& seq, std::span<const int32_t> tokens,
                         std::span<const int32_t> pages, int64_t snapshot) {
  const int64_t page = kv_->page_size();
  const auto n = static_cast<int64_t>(tokens.size());
  METRALE_CHECK(seq.tokens.empty() && seq.block_table.empty() && seq.state_slot < 0,
                "adopt_prefix: the sequence already holds ", seq.tokens.size(), " tokens and ",
                seq.block_table.size(), " pages", seq.state_slot >= 0 ? " and a state slot" : "",
                "; a prefix is adopted before the first step");
  METRALE_CHECK(!pages.empty() && n == static_cast<int64_t>(pages.size()) * page,
                "adopt_prefix: ", n, " tokens in ", pages.size(), " pages of ", page,
                " tokens; expected whole pages, at least one");
  METRALE_CHECK(n <= context_, "adopt_prefix: a prefix of ", n, " tokens exceeds the context of ",
                context_, " tokens");
  check_ids(tokens);
  std::vector<int32_t> sorted(pages.begin(), pages.end());
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  METRALE_CHECK(twice == sorted.end(), "adopt_prefix: page ", twice == sorted.end() ? 0 : *twice,
                " appears twice in the prefix's pages");
  if (state_ == nullptr) {
    METRALE_CHECK(snapshot == -1, "adopt_prefix: snapshot ", snapshot,
                  " given, but the model keeps no recurrent state");
  } else {
    METRALE_CHECK(snapshot >= 0 && snapshot < state_->plan().snapshot_slots,
                  "adopt_prefix: a hybrid model resumes from a state snapshot; snapshot ", snapshot,
                  " is outside [0, ", state_->plan().snapshot_slots,
                  ") (LoadOptions::state_snapshots)");
  }
  kv_->retain(pages);  // throws for pages outside the pool or free, retaining nothing
  if (state_ != nullptr) {
    try {
      seq.state_slot = state_->acquire(&seq);
    } catch (...) {
      kv_->drop(pages);
      throw;
    }
    state_->copy_block(state_->snapshot_block(snapshot),
                       state_->block(seq.state_slot, n % state_->plan().versions),
                       state_->plan().block_bytes);
    seq.state_floor = n;
  }
  seq.block_table.assign(pages.begin(), pages.end());
  seq.tokens.assign(tokens.begin(), tokens.end());
}

void Model::save_state(const Sequence& seq, int64_t snapshot) {
  METRALE_CHECK(state_ != nullptr, "save_state: the model keeps no recurrent state");
  METRALE_CHECK(seq.state_slot >= 0, "save_state: the sequence has no state slot (no step yet)");
  state_->check_owner(seq.state_slot, &seq);
  const auto n = static_cast<int64_t>(seq.tokens.size());
  METRALE_CHECK(n >= seq.state_floor, "save_state: the state after ", n,
                " tokens is no longer held (the ring keeps ", seq.state_floor, " tokens and on)");
  state_->copy_block(state_->block(seq.state_slot, n % state_->plan().versions),
                     state_->snapshot_block(snapshot), state_->plan().block_bytes);
}

LoraPool& Model::enable_lora(const LoraPoolOptions& options) {
  METRALE_CHECK(lora_ == nullptr, "LoRA: the model already has a LoRA pool");
  lora_ = std::make_unique<LoraPool>(*arch_, *backend_, config_, options);
  record_graphs();  // with the adapters' nodes
  return *lora_;
}

void Model::set_adapter(Sequence& seq, const std::string& name) {
  METRALE_CHECK(seq.tokens.empty(), "set_adapter: the sequence already holds ", seq.tokens.size(),
                " tokens; choose its adapter before its first step");
  METRALE_CHECK(name.empty() || lora_ != nullptr, "set_adapter: adapter '", name,
                "' asked for, but the model has no LoRA pool");
  const LoraRef next = name.empty() ? LoraRef{} : lora_->acquire(name);
  if (!seq.lora.base()) lora_->release(seq.lora);
  seq.lora = next;
}

void Model::release(Sequence& seq) {
  if (!seq.lora.base() && lora_ != nullptr) {
    lora_->release(seq.lora);
    seq.lora = {};
  }
  if (state_ != nullptr && seq.state_slot >= 0) state_->release(seq.state_slot, &seq);
  seq.state_slot = -1;
  seq.state_floor = 0;
  seq.tree_start = -1;
  kv_->release(seq.block_table);
  seq.tokens.clear();
}

}  // namespace metrale
