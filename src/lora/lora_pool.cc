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
  // Remember how to detach (the destructor undoes every attachment).
  detach_ = [attach]() {
    for (const Attach& a : attach) {
      if (a.linear != nullptr) {
        a.linear->attach_lora(a.part, nullptr);
      } else {
        *a.expert = nullptr;
      }
    }
  };
  slots_.resize(static_cast<size_t>(S));
  adapters_.resize(static_cast<size_t>(S));
  heads_.resize(static_cast<size_t>(S));
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
  auto put = [&](void* base, int64_t at, const float* src, int64_t n) {
    if (options_.dtype == DType::kBF16) {
      from_f32(src, DType::kBF16, static_cast<uint16_t*>(base) + at, static_cast<size_t>(n));
    } else {
      std::memcpy(static_cast<float*>(base) + at, src, static_cast<size_t>(n) * sizeof(float));
    }
  };
  for (size_t i = 0; i < modules_.size(); ++i) {
    Module& m = *modules_[i];
    const int64_t E = m.w.n_experts, in = m.w.n_in, out = m.w.n_out;
    // Zero the slot's share (the padding), then copy the adapter's ranks in.
    auto* a = const_cast<std::byte*>(static_cast<const std::byte*>(m.w.a));
    auto* b = const_cast<std::byte*>(static_cast<const std::byte*>(m.w.b));
    std::memset(a + slot * E * R * in * static_cast<int64_t>(elem), 0,
                static_cast<size_t>(E * R * in) * elem);
    std::memset(b + slot * E * R * out * static_cast<int64_t>(elem), 0,
                static_cast<size_t>(E * R * out) * elem);
    const LoraPair* p = pair_of[i];
    m.rank[s] = p == nullptr ? 0 : static_cast<int32_t>(p->rank);
    m.scale[s] = p == nullptr ? 0.0f : p->scale;
    if (p == nullptr) continue;
    const int64_t r = p->rank;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t blk = slot * E + e;
      put(a, blk * R * in, p->a.data() + e * r * in, r * in);  // rows [0, r) of [R, in]
      // B [out, r] -> rows [0, r) of B^T [R, out].
      bt.resize(static_cast<size_t>(r * out));
      for (int64_t o = 0; o < out; ++o)
        for (int64_t j = 0; j < r; ++j)
          bt[static_cast<size_t>(j * out + o)] = p->b[static_cast<size_t>((e * out + o) * r + j)];
      put(b, blk * R * out, bt.data(), r * out);
    }
  }
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
  WeightTensor head;
  if (!ad->lm_head.empty()) {
    head = backend_->prepare({.name = dir.string() + ": lm_head.weight",
                              .format = WeightFormat::kF32,
                              .n_out = info_.vocab,
                              .n_in = info_.hidden,
                              .data = ad->lm_head.data()},
                             PrepareMode::kInPlace);
  }
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
  SlotInfo& info = slots_[static_cast<size_t>(s)];
  info = {.name = name,
          .dir = dir,
          .generation = info.generation + 1,
          .refs = 0,
          .pinned = pinned,
          .last_used = ++clock_};
  adapters_[static_cast<size_t>(s)] = std::move(ad);
  heads_[static_cast<size_t>(s)] = std::move(head);
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
  heads_[static_cast<size_t>(s)] = {};
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
  return std::any_of(adapters_.begin(), adapters_.end(), [](const auto& a) {
    return a && (!a->embed_tokens.empty() || !a->tokens.ids.empty());
  });
}

bool LoraPool::has_head_overlays() const {
  return std::any_of(adapters_.begin(), adapters_.end(), [&](const auto& a) {
    return a && (!a->lm_head.empty() || (info_.tied_embeddings && !a->tokens.ids.empty()));
  });
}

void LoraPool::apply_embedding(std::span<const int32_t> ids, std::span<const int32_t> slots,
                               Rows h) const {
  const int64_t H = info_.hidden;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (slots[r] < 0) continue;
    const PeftAdapter* ad = adapters_[static_cast<size_t>(slots[r])].get();
    if (ad == nullptr) continue;
    float* row = h.row(static_cast<int64_t>(r));
    if (!ad->embed_tokens.empty())
      std::copy_n(ad->embed_tokens.data() + static_cast<int64_t>(ids[r]) * H, H, row);
    const auto& t = ad->tokens.ids;
    auto it = std::lower_bound(t.begin(), t.end(), ids[r]);
    if (it != t.end() && *it == ids[r])
      std::copy_n(ad->tokens.rows.data() + (it - t.begin()) * H, H, row);
  }
}

void LoraPool::apply_head(ConstRows x, std::span<const int32_t> slots, Rows logits) const {
  const int64_t H = info_.hidden;
  for (int64_t r = 0; r < x.n_rows; ++r) {
    const int32_t s = slots[static_cast<size_t>(r)];
    if (s < 0) continue;
    const PeftAdapter* ad = adapters_[static_cast<size_t>(s)].get();
    if (ad == nullptr) continue;
    const ConstRows xr{x.row(r), 1, x.n_cols, x.stride};
    if (!ad->lm_head.empty()) {
      backend_->linear(xr, heads_[static_cast<size_t>(s)],
                       Rows{logits.row(r), 1, logits.n_cols, logits.stride});
    }
    if (info_.tied_embeddings && !ad->tokens.ids.empty()) {
      // The tied head's rows of the trainable tokens are the new rows too.
      for (size_t k = 0; k < ad->tokens.ids.size(); ++k) {
        const float* w = ad->tokens.rows.data() + static_cast<int64_t>(k) * H;
        float acc = 0.0f;
        for (int64_t d = 0; d < H; ++d) acc += w[d] * xr.row(0)[d];
        logits.row(r)[ad->tokens.ids[k]] = acc;
      }
    }
  }
}

}  // namespace metrale
