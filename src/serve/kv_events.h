#pragma once
// KV-cache events: the pages the prefix cache stores and gives back, in the terms of vLLM's KV
// events (vllm/distributed/kv_events.py: BlockStored, BlockRemoved, AllBlocksCleared; a block
// is one KV page), so a KV-aware router can follow which replica holds which prefix. No
// transport here: kvevents/ publishes them over ZMQ.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace metrale {

// Pages newly held by the prefix cache, consecutive in one sequence.
struct KvBlockStored {
  std::vector<uint64_t> block_hashes;         // one per page; kv_block_hash chains them
  std::optional<uint64_t> parent_block_hash;  // the page before the first, if there is one
  std::vector<int32_t> token_ids;             // the pages' tokens, block_size per page
  int64_t block_size = 0;                     // tokens per page
  std::optional<int64_t> lora_id;             // the adapter's LoRA slot + 1; none: base model
  std::string lora_name;                      // the adapter's name; "": base model
};

// Pages the prefix cache gave back (evicted, or flushed).
struct KvBlockRemoved {
  std::vector<uint64_t> block_hashes;
};

// The prefix cache holds nothing any more.
struct KvAllBlocksCleared {};

using KvCacheEvent = std::variant<KvBlockStored, KvBlockRemoved, KvAllBlocksCleared>;

// A page's hash: of the page before it (none for a prefix's first page), its tokens and the
// adapter that computed it, so equal hashes mean equal prefixes. 63 bits (consumers that read
// hashes as signed 64-bit integers, as vLLM's were, see the same value).
uint64_t kv_block_hash(std::optional<uint64_t> parent, std::span<const int32_t> tokens,
                       std::string_view lora_name);

}  // namespace metrale
