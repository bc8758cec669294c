#pragma once
// The recurrent-state pool of a hybrid model (Gated DeltaNet layers beside attention), and
// ssm_reserve: the byte and slot arithmetic that sizes it.
//
// A *block* holds the state of every linear-attention layer after one token: each layer's
// conv state [K - 1, C] and SSM state [n_v_heads, k_head_dim, v_head_dim], at offsets the
// model fixes at load (StateLayout). The pool is one allocation of
//
//   slots            = max_seqs + 1   (one per live sequence, plus a padding dummy that rows
//                                      padded up to a fixed batch width read and write)
//   versions / slot  = ring_depth + 1 (the live state plus ring_depth earlier ones: a step may
//                                      verify up to ring_depth draft tokens, keeping the state
//                                      after each, and roll back to any of them)
//   snapshot blocks  = snapshot_slots (prefix caching: a state copied out at a page boundary)
//
// blocks of block_bytes each. Version v of a slot holds the state after the sequence's
// token count t with t % (ring_depth + 1) == v (engine/model.cc keeps the counts).
//
// plan_state_reserve() is the only arithmetic: StatePool's constructor allocates exactly
// what the plan says, so the two cannot disagree (tests/engine/state_pool_test.cc).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "io/config/model_config.h"
#include "layers/block.h"

namespace metrale {

// The rollback depths tried, deepest first; the first that fits the budget wins.
inline constexpr int64_t kStateRingLadder[] = {8, 4, 2, 1, 0};

// One layer's share of a block: LayerStateShape (layers/block.h, what a Mixer reports).

// One entry per decoder layer of `config`: the Gated DeltaNet shapes for kLinearAttention
// layers, zeros for the others. The engine checks its layers agree with this at load.
// Throws an Error naming the config and field when a linear layer's conv kernel is < 2.
std::vector<LayerStateShape> linear_state_shapes(const ModelConfig& config);

// Where each layer's state sits in a block (bytes), for a storage dtype.
struct StateLayout {
  DType dtype = DType::kF32;  // kF32 or kF16
  struct Layer {
    // Meaningful only for layers with state. The bytes are the states' own sizes (elements x
    // element size), without the padding up to the next 64-byte boundary.
    size_t conv_offset = 0, ssm_offset = 0;
    size_t conv_bytes = 0, ssm_bytes = 0;
    bool has_state = false;
  };
  std::vector<Layer> layers;  // one per decoder layer
  size_t block_bytes = 0;     // each layer's states back to back, each start 64-byte aligned
  int64_t n_state_layers() const;
};
// Lays out `shapes` (one per decoder layer; zero shapes for attention layers). Throws for a
// dtype other than kF32 / kF16, a negative shape or a block past SIZE_MAX. No layer with state
// gives block_bytes 0 (which plan_state_reserve refuses).
StateLayout layout_states(std::span<const LayerStateShape> shapes, DType dtype);

struct StateReserveRequest {
  int64_t max_seqs = 0;        // live sequences at once (>= 1)
  size_t block_bytes = 0;      // StateLayout::block_bytes
  int64_t snapshot_slots = 0;  // blocks kept for prefix caching
  // Bytes the pool may take; nullopt: no limit (the deepest ladder entry).
  std::optional<uint64_t> budget;
  // Force a ring depth (any >= 0, in the ladder or not) instead of choosing one from the
  // ladder; it must fit the budget.
  std::optional<int64_t> ring_depth;
};

struct StateReservePlan {
  int64_t max_seqs = 0;
  int64_t slots = 0;       // max_seqs + 1 (the last one is the padding dummy)
  int64_t ring_depth = 0;  // from kStateRingLadder, or the forced depth
  int64_t versions = 0;    // ring_depth + 1 per slot
  int64_t snapshot_slots = 0;
  size_t block_bytes = 0;
  uint64_t slot_bytes = 0;      // versions * block_bytes
  uint64_t snapshot_bytes = 0;  // snapshot_slots * block_bytes
  uint64_t total_bytes = 0;     // slots * slot_bytes + snapshot_bytes
  std::optional<uint64_t> budget;
  bool forced = false;  // ring_depth came from the request, not the ladder
  // What was weighed (for `inspect`): every ladder depth with the total it takes, deepest
  // first, whether or not it fits; a forced depth alone.
  std::vector<std::pair<int64_t, uint64_t>> tried;
};

// The deepest ring that fits. Throws an Error naming the budget and the smallest total (ring
// depth 0) when nothing fits, or when the request is malformed (max_seqs < 1 or past
// INT32_MAX - 1, block_bytes 0, snapshot_slots < 0, a negative forced depth, a total past
// 2^64 bytes).
StateReservePlan plan_state_reserve(const StateReserveRequest& request);
// A few lines for `metrale inspect --max-batch N [--budget BYTES]`.
std::string describe(const StateReservePlan& plan, const StateLayout& layout);

// "1073741824", "512MiB", "2GiB", "1GB", "64k" -> bytes: a whole number, then (optionally
// after spaces) binary units KiB MiB GiB TiB (also K M G T, Ki Mi Gi Ti) or decimal KB MB GB TB
// or B, case-insensitive. Throws an Error naming `what` (e.g. "--budget") and the text when it
// is not such a size (a fraction such as 1.5GiB included: write 1536MiB) or exceeds 2^64 - 1.
uint64_t parse_byte_size(std::string_view text, std::string_view what);

class StatePool {
 public:
  // Allocates plan.total_bytes (zeroed) on the backend. Throws when the plan is not one
  // plan_state_reserve could have made for `layout` (block_bytes differ, the totals do not add
  // up), or when the backend's buffer is not exactly plan.total_bytes.
  StatePool(Backend& backend, const StateReservePlan& plan, StateLayout layout);

  const StateReservePlan& plan() const { return plan_; }
  const StateLayout& layout() const { return layout_; }
  uint64_t allocated_bytes() const { return buffer_.size(); }

  // A free slot for `owner` (an opaque identity, the engine's Sequence*; not null), its blocks
  // zeroed (a fresh sequence's state); the lowest free slot, so the choice is deterministic.
  // Throws "state pool full: N slots in use" when none is free, and when `owner` already
  // holds a slot.
  int32_t acquire(const void* owner);
  // Returns the slot; throws when `owner` does not hold it.
  void release(int32_t slot, const void* owner);
  // Throws an Error unless `owner` holds `slot` (a slot used by two sequences).
  void check_owner(int32_t slot, const void* owner) const;
  int32_t dummy_slot() const { return static_cast<int32_t>(plan_.slots - 1); }
  int64_t free_slots() const;

  // Version `version` of `slot` (the dummy slot included); both bounds-checked.
  std::byte* block(int32_t slot, int64_t version) const;
  // Snapshot block `index` in [0, snapshot_slots).
  std::byte* snapshot_block(int64_t index) const;
  // Copies one block into another (snapshot save / restore, version copies); from == to is a
  // no-op. A backend copy: the blocks are backend memory.
  void copy_block(const std::byte* from, std::byte* to, size_t bytes) const;
  // Zeroes one block; throws unless `block` is the start of a block of this pool.
  void zero_block(std::byte* block) const;

 private:
  Backend* backend_;
  StateReservePlan plan_;
  StateLayout layout_;
  Buffer buffer_;
  std::vector<const void*> owner_;  // [slots - 1]; null: free
  int64_t in_use_ = 0;
};

}  // namespace metrale
