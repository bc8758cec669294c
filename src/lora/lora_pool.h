#pragma once
// LoraPool: many PEFT LoRA adapters served at once. One allocation holds max_loras equal
// slots; in every slot each adaptable module (a part of a Linear, or an MoE layer's experts)
// has its A [max_rank, n_in] and B^T [max_rank, n_out], the adapter's rank r zero-padded (the
// kernels use only the first r ranks of a slot, so the padding contributes exactly nothing),
// and a per-slot rank and scale (alpha / r, or alpha / sqrt(r) under rsLoRA). The pool
// attaches these LoraWeights to the model's Linears and MoE blocks once; a pass then routes
// each row to its slot (ForwardContext::lora_slots, -1: base weights), so one step mixes many
// adapters and the base model over any weight format the base uses.
//
// Slots: adapters loaded pinned keep theirs; the others form an LRU cache with reference
// counts (a sequence using an adapter holds one). Loading picks the first empty slot, else the
// least recently used one with no references, else fails ("pool full"). Every load and unload
// bumps the slot's generation, so a LoraRef to what a slot held before is detected as stale
// and refused, never served with another adapter's weights.
//
// Token overlays (trainable_token_indices, modules_to_save on embed_tokens / lm_head) are kept
// per slot in backend memory and attached to the Architecture (lora_overlays), whose recorded
// pass applies them with the backend's token_overlay / head_overlay ops to that slot's rows.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "layers/architecture.h"
#include "lora/peft_adapter.h"

namespace metrale {

struct LoraPoolOptions {
  int64_t max_loras = 4;      // slots
  int64_t max_rank = 16;      // the largest adapter rank a slot holds
  DType dtype = DType::kF32;  // slot storage: kF32 or kBF16 (computed in f32 either way)
};

// What a sequence holds to use an adapter: its slot and the slot's generation when acquired.
struct LoraRef {
  int32_t slot = -1;  // -1: the base model
  uint32_t generation = 0;
  bool base() const { return slot < 0; }
};

class LoraPool {
 public:
  // Reserves the slots for every site of `arch` and attaches them. `arch` and `backend` must
  // outlive the pool; the pool must outlive every pass that uses it.
  LoraPool(Architecture& arch, Backend& backend, const ModelConfig& config,
           const LoraPoolOptions& options);
  ~LoraPool();
  LoraPool(const LoraPool&) = delete;
  LoraPool& operator=(const LoraPool&) = delete;

  const LoraPoolOptions& options() const { return options_; }
  const LoraModelInfo& model_info() const { return info_; }
  uint64_t bytes() const { return bytes_; }

  // Reads and audits `dir`, then copies it into a slot (see above). On any error — a bad
  // adapter, a rank above max_rank, a full pool — nothing changes. Returns the slot's fresh
  // reference (not counted: acquire() counts).
  LoraRef load(const std::string& name, const std::filesystem::path& dir, bool pinned = false);
  // Frees the adapter's slot; refused while a sequence holds it.
  void unload(const std::string& name);
  // A counted reference to a loaded adapter (marks it used for the LRU).
  LoraRef acquire(const std::string& name);
  void release(LoraRef ref);
  // Throws unless `ref` is the base model or names what its slot holds now.
  void check(LoraRef ref) const;
  // Marks the slot used (a step ran it).
  void touch(LoraRef ref);

  bool loaded(const std::string& name) const { return find(name) >= 0; }
  // The adapter in a slot ("" when empty), its references and generation.
  struct SlotInfo {
    std::string name;
    std::filesystem::path dir;
    uint32_t generation = 0;
    int64_t refs = 0;
    bool pinned = false;
    uint64_t last_used = 0;
  };
  std::span<const SlotInfo> slots() const { return slots_; }

  // Whether any slot holds an overlay of that kind (the engine skips the pass otherwise).
  bool has_embedding_overlays() const;
  bool has_head_overlays() const;

 private:
  struct Module;
  int32_t find(const std::string& name) const;
  int32_t victim() const;
  void write_slot(int32_t slot, const PeftAdapter& adapter);
  // The adapter's token overlays copied into backend memory (head: a saved lm_head, prepared;
  // the overlay's head pointer is set once it has its slot).
  struct Overlays {
    Buffer memory;
    LoraSlotOverlay overlay;
    WeightTensor head;
  };
  Overlays make_overlays(const PeftAdapter& adapter);

  LoraPoolOptions options_;
  Backend* backend_;
  LoraModelInfo info_;
  std::vector<std::unique_ptr<Module>> modules_;  // [info_.modules]
  Buffer memory_;
  uint64_t bytes_ = 0;
  std::vector<SlotInfo> slots_;
  std::vector<std::shared_ptr<const PeftAdapter>> adapters_;  // [slots]
  std::vector<WeightTensor> heads_;                           // [slots]: saved lm_head, prepared
  std::vector<LoraSlotOverlay> overlays_;                     // [slots] what the ops read
  std::vector<Buffer> overlay_memory_;                        // [slots] their backend memory
  uint64_t clock_ = 0;
  std::function<void()> detach_;  // undoes the attachments
};

}  // namespace metrale
