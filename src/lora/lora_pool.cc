#include "lora/lora_pool.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/dtype.h"
#include "core/error.h"

namespace metrale {

// One adaptable module's share of the pool: its slots' weights, ranks and scales.
struct LoraPool::Module {
  LoraWeights w;
  std::vector<int32_t> rank;  // [slots]
  std::vector<float> scale;   // [slots]
};

LoraPool::LoraPool(Architecture& arch, Backend& backend, const ModelConfig& config,
                   const LoraPoolOptions& options)
    : options_(options), backend_(&backend) {
  METRALE_CHECK(options.max_loras >= 1 && options.max_loras <= 4096, "LoRA pool: max_loras ",
                options.max_loras, " must be in [1, 4096]");
  METRALE_CHECK(options.max_rank >= 1 && options.max_rank <= 4096, "LoRA pool: max_rank ",
                options.max_rank, " must be in [1, 4096]");
  METRALE_CHECK(options.dtype == DType::kF32 || options.dtype == DType::kBF16,
                "LoRA pool: storage dtype ", dtype_name(options.dtype), ", expected f32 or bf16");
  info_.model_type = config.model_type;
  info_.hidden = config.hidden_size;
  info_.vocab = config.vocab_size;
  info_.tied_embeddings = arch.tied;
  LoraSites sites = arch.lora_sites();
  // Where each module attaches: a Linear's part, or an experts block's gate_up / down.
  struct Attach {
    Linear* linear = nullptr;
    size_t part = 0;
    const LoraWeights** expert = nullptr;
  };
  std::vector<Attach> attach;
  std::set<std::string> names;
  auto add = [&](LoraModule m, Attach a) {
    METRALE_CHECK(names.insert(m.name).second, "LoRA pool: module '", m.name, "' appears twice");
    info_.modules.push_back(std::move(m));
    attach.push_back(a);
  };
  for (Linear* l : sites.linears) {
    for (size_t i = 0; i < l->parts().size(); ++i) {
      const Linear::Part& p = l->parts()[i];
      add({.name = p.name, .n_in = l->n_in(), .n_out = p.n_out}, {.linear = l, .part = i});
    }
  }
  for (const ExpertLoraSite& e : sites.experts) {
    add({.name = e.prefix + ".gate_up_proj",
         .kind = LoraModule::Kind::kExpertsGateUp,
         .n_in = e.hidden,
         .n_out = 2 * e.intermediate,
         .n_experts = e.n_experts},
        {.expert = e.gate_up});
    add({.name = e.prefix + ".down_proj",
         .kind = LoraModule::Kind::kExpertsDown,
         .n_in = e.intermediate,
         .n_out = e.hidden,
         .n_experts = e.n_experts},
        {.expert = e.down});
  }
  // One allocation for every module's slots.
  const int64_t S = options.max_loras, R = options.max_rank;
  const size_t elem = options.dtype == DType::kBF16 ? 2 : 4;
  std::vector<std::pair<size_t, size_t>> offsets;
  size_t at = 0;
  for (const LoraModule& m : info_.modules) {
    const auto a_elems = static_cast<size_t>(S * m.n_experts * R * m.n_in);
    const auto b_elems = static_cast<size_t>(S * m.n_experts * R * m.n_out);
    offsets.emplace_back(at, at + a_elems * elem);
    at += (a_elems + b_elems) * elem;
    at = (at + 63) / 64 * 64;
  }
  bytes_ = at;
  memory_ = backend.allocate(std::max<size_t>(at, 64));
  auto* base = memory_.as<std::byte>();
  for (size_t i = 0; i < info_.modules.size(); ++i) {
    const LoraModule& m = info_.modules[i];
    auto mod = std::make_unique<Module>();
    mod->rank.assign(static_cast<size_t>(S), 0);
    mod->scale.assign(static_cast<size_t>(S), 0.0f);
    mod->w = {.a = base + offsets[i].first,
              .b = base + offsets[i].second,
              .dtype = options.dtype,
              .n_slots = S,
              .n_experts = m.n_experts,
              .max_rank = R,
              .n_in = m.n_in,
              .n_out = m.n_out,
              .rank = mod->rank.data(),
              .scale = mod->scale.data()};
    if (attach[i].linear != nullptr) {
      attach[i].linear->attach_lora(attach[i].part, &mod->w);
    } else {
      *attach[i].expert = &mod->w;
    }
    modules_.push_back(std::move(mod));
  }
  slots_.resize(static_cast<size_t>(S));
  adapters_.resize(static_cast<size_t>(S));
  heads_.resize(static_cast<size_t>(S));
  overlays_.resize(static_cast<size_t>(S));
  overlay_memory_.resize(static_cast<size_t>(S));
  arch.lora_overlays = overlays_;
  // Remember how to detach (the destructor undoes every attachment).
  detach_ = [attach, &arch]() {
    arch.lora_overlays = {};
    for (const Attach& a : attach) {
      if (a.linear != nullptr) {
        a.linear->attach_lora(a.part, nullptr);
      } else {
        *a.expert = nullptr;
      }
    }
  };
}

LoraPool::~LoraPool() {
  if (detach_) detach_();
}

int32_t LoraPool::find(const std::string& name) const {
  for (size_t s = 0; s < slots_.size(); ++s)
    if (!slots_[s].name.empty() && slots_[s].name == name) return static_cast<int32_t>(s);
  return -1;
}

int32_t LoraPool::victim() const {
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s].name.empty()) return static_cast<int32_t>(s);
  int32_t best = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const SlotInfo& i = slots_[s];
    if (i.pinned || i.refs > 0) continue;
    if (best < 0 || i.last_used < slots_[static_cast<size_t>(best)].last_used)
      best = static_cast<int32_t>(s);
  }
  return best;
}

void LoraPool::write_slot(int32_t slot, const PeftAdapter& ad) {
  const int64_t R = options_.max_rank;
  const size_t elem = options_.dtype == DType::kBF16 ? 2 : 4;
  const auto s = static_cast<size_t>(slot);
  std::vector<const LoraPair*> pair_of(modules_.size(), nullptr);
  std::vector<float> bt;
  for (const LoraPair& p : ad.pairs) pair_of[p.module] = &p;
  // A slot's share of a module is staged on the host (zero padding included) and uploaded.
  std::vector<std::byte> stage_a, stage_b;
  auto put = [&](std::vector<std::byte>& stage, int64_t at, const float* src, int64_t n) {
    if (options_.dtype == DType::kBF16) {
      from_f32(src, DType::kBF16, reinterpret_cast<uint16_t*>(stage.data()) + at,
               static_cast<size_t>(n));
    } else {
      std::memcpy(reinterpret_cast<float*>(stage.data()) + at, src,
                  static_cast<size_t>(n) * sizeof(float));
    }
  };
  for (size_t i = 0; i < modules_.size(); ++i) {
    Module& m = *modules_[i];
    const int64_t E = m.w.n_experts, in = m.w.n_in, out = m.w.n_out;
    stage_a.assign(static_cast<size_t>(E * R * in) * elem, std::byte{0});
    stage_b.assign(static_cast<size_t>(E * R * out) * elem, std::byte{0});
    const LoraPair* p = pair_of[i];
    m.rank[s] = p == nullptr ? 0 : static_cast<int32_t>(p->rank);
    m.scale[s] = p == nullptr ? 0.0f : p->scale;
    if (p != nullptr) {
      const int64_t r = p->rank;
      for (int64_t e = 0; e < E; ++e) {
        put(stage_a, e * R * in, p->a.data() + e * r * in, r * in);  // rows [0, r) of [R, in]
        // B [out, r] -> rows [0, r) of B^T [R, out].
        bt.resize(static_cast<size_t>(r * out));
        for (int64_t o = 0; o < out; ++o)
          for (int64_t j = 0; j < r; ++j)
            bt[static_cast<size_t>(j * out + o)] = p->b[static_cast<size_t>((e * out + o) * r + j)];
        put(stage_b, e * R * out, bt.data(), r * out);
      }
    }
    auto* a = const_cast<std::byte*>(static_cast<const std::byte*>(m.w.a));
    auto* b = const_cast<std::byte*>(static_cast<const std::byte*>(m.w.b));
    backend_->upload(a + static_cast<size_t>(slot) * stage_a.size(), stage_a.data(),
                     stage_a.size());
    backend_->upload(b + static_cast<size_t>(slot) * stage_b.size(), stage_b.data(),
                     stage_b.size());
  }
}

LoraPool::Overlays LoraPool::make_overlays(const PeftAdapter& ad) {
  const int64_t H = info_.hidden, V = info_.vocab;
  const auto n_tokens = static_cast<int64_t>(ad.tokens.ids.size());
  // One buffer: [embed_tokens | token rows | lm_head | token ids], each 64-byte aligned.
  auto aligned = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
  const size_t embed_bytes = ad.embed_tokens.empty() ? 0 : static_cast<size_t>(V * H) * 4;
  const size_t rows_bytes = static_cast<size_t>(n_tokens * H) * 4;
  const size_t head_bytes = ad.lm_head.empty() ? 0 : static_cast<size_t>(V * H) * 4;
  const size_t ids_bytes = static_cast<size_t>(n_tokens) * 4;
  const size_t at_rows = aligned(embed_bytes), at_head = at_rows + aligned(rows_bytes),
               at_ids = at_head + aligned(head_bytes);
  Overlays out;
  if (at_ids + ids_bytes == 0) return out;
  out.memory = backend_->allocate(at_ids + ids_bytes);
  auto* base = out.memory.as<std::byte>();
  LoraSlotOverlay& o = out.overlay;
  if (embed_bytes > 0) {
    backend_->upload(base, ad.embed_tokens.data(), embed_bytes);
    o.embed = reinterpret_cast<const float*>(base);
  }
  if (n_tokens > 0) {
    backend_->upload(base + at_rows, ad.tokens.rows.data(), rows_bytes);
    backend_->upload(base + at_ids, ad.tokens.ids.data(), ids_bytes);
    o.token_rows = reinterpret_cast<const float*>(base + at_rows);
    o.token_ids = reinterpret_cast<const int32_t*>(base + at_ids);
    o.n_tokens = n_tokens;
    o.tied_tokens = info_.tied_embeddings;
  }
  if (head_bytes > 0) {
    backend_->upload(base + at_head, ad.lm_head.data(), head_bytes);
    out.head = backend_->prepare({.name = ad.dir.string() + ": lm_head.weight",
                                  .format = WeightFormat::kF32,
                                  .n_out = V,
                                  .n_in = H,
                                  .data = base + at_head},
                                 PrepareMode::kInPlace);
  }
  return out;
}

LoraRef LoraPool::load(const std::string& name, const std::filesystem::path& dir, bool pinned) {
  METRALE_CHECK(!name.empty(), "LoRA: an adapter needs a name");
  METRALE_CHECK(find(name) < 0, "LoRA: adapter '", name, "' is already loaded (in slot ",
                find(name), "); unload it first");
  auto ad = std::make_shared<const PeftAdapter>(load_peft_adapter(dir, name, info_));
  for (const LoraPair& p : ad->pairs) {
    METRALE_CHECK(p.rank <= options_.max_rank, dir.string(), ": tensor '", p.a_key, "': rank ",
                  p.rank, " exceeds the LoRA pool's max rank ", options_.max_rank,
                  " (start with a larger --lora-max-rank)");
  }
  Overlays overlays = make_overlays(*ad);
  const int32_t s = victim();
  if (s < 0) {
    std::string held;
    for (const SlotInfo& i : slots_) {
      held += (held.empty() ? "" : ", ") + i.name + (i.pinned ? " (pinned)" : "") + " (" +
              std::to_string(i.refs) + " refs)";
    }
    throw make_error("LoRA pool full: all ", slots_.size(), " slots are pinned or in use (", held,
                     "); cannot load '", name, "'");
  }
  write_slot(s, *ad);
  const auto us = static_cast<size_t>(s);
  heads_[us] = std::move(overlays.head);
  overlays_[us] = overlays.overlay;
  if (heads_[us].data != nullptr) overlays_[us].head = &heads_[us];
  overlay_memory_[us] = std::move(overlays.memory);
  SlotInfo& info = slots_[static_cast<size_t>(s)];
  info = {.name = name,
          .dir = dir,
          .generation = info.generation + 1,
          .refs = 0,
          .pinned = pinned,
          .last_used = ++clock_};
  adapters_[static_cast<size_t>(s)] = std::move(ad);
  return {s, info.generation};
}

void LoraPool::unload(const std::string& name) {
  const int32_t s = find(name);
  METRALE_CHECK(s >= 0, "LoRA: adapter '", name, "' is not loaded");
  SlotInfo& info = slots_[static_cast<size_t>(s)];
  METRALE_CHECK(info.refs == 0, "LoRA: adapter '", name, "' is in use by ", info.refs,
                " sequence(s)");
  for (auto& m : modules_) m->rank[static_cast<size_t>(s)] = 0;
  info = {.generation = info.generation + 1};
  adapters_[static_cast<size_t>(s)].reset();
  overlays_[static_cast<size_t>(s)] = {};
  heads_[static_cast<size_t>(s)] = {};
  overlay_memory_[static_cast<size_t>(s)] = Buffer();
}

LoraRef LoraPool::acquire(const std::string& name) {
  const int32_t s = find(name);
  METRALE_CHECK(s >= 0, "LoRA: adapter '", name, "' is not loaded");
  SlotInfo& info = slots_[static_cast<size_t>(s)];
  ++info.refs;
  info.last_used = ++clock_;
  return {s, info.generation};
}

void LoraPool::check(LoraRef ref) const {
  if (ref.base()) return;
  METRALE_CHECK(static_cast<size_t>(ref.slot) < slots_.size(), "LoRA: slot ", ref.slot,
                " outside the pool's ", slots_.size());
  const SlotInfo& info = slots_[static_cast<size_t>(ref.slot)];
  METRALE_CHECK(!info.name.empty() && info.generation == ref.generation,
                "LoRA: stale adapter reference (slot ", ref.slot, " generation ", ref.generation,
                "); the slot now holds ",
                info.name.empty() ? std::string("nothing") : "'" + info.name + "'",
                " at generation ", info.generation);
}

void LoraPool::release(LoraRef ref) {
  if (ref.base()) return;
  check(ref);
  SlotInfo& info = slots_[static_cast<size_t>(ref.slot)];
  METRALE_CHECK(info.refs > 0, "LoRA: adapter '", info.name, "' released more than acquired");
  --info.refs;
}

void LoraPool::touch(LoraRef ref) {
  if (!ref.base()) slots_[static_cast<size_t>(ref.slot)].last_used = ++clock_;
}

bool LoraPool::has_embedding_overlays() const {
  return std::any_of(overlays_.begin(), overlays_.end(),
                     [](const LoraSlotOverlay& o) { return o.embeds(); });
}

bool LoraPool::has_head_overlays() const {
  return std::any_of(overlays_.begin(), overlays_.end(),
                     [](const LoraSlotOverlay& o) { return o.heads(); });
}

}  // namespace metrale
