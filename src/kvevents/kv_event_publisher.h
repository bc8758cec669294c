#pragma once
// KV-cache events (serve/kv_events.h) on the wire vLLM's publisher uses
// (vllm/distributed/kv_events.py, ZmqEventPublisher), so the subscribers written for vLLM —
// llm-d's KV-cache indexer, vllm-router's kv_aware policy, Dynamo — can read a metrale replica:
//
//   a ZMQ PUB socket bound at `endpoint`; each batch is one 3-part message:
//     [topic, sequence number (8 bytes, big-endian, from 0), payload]
//   payload: MessagePack of vLLM's structs as msgspec encodes them, in one of two layouts:
//   kMap (vLLM's current kv_events.py: plain Structs, so maps; a tagged union's tag under
//   "type"):
//     KVEventBatch      {"ts": float64 Unix seconds, "events": [...], "data_parallel_rank": 0}
//     BlockStored       {"type": "BlockStored", "block_hashes": [...], "parent_block_hash",
//                        "token_ids": [...], "block_size", "lora_id", "medium", "lora_name"}
//     BlockRemoved      {"type": "BlockRemoved", "block_hashes": [...], "medium"}
//     AllBlocksCleared  {"type": "AllBlocksCleared"}
//   kArray (earlier vLLM releases: array_like Structs, fields by position):
//     [ts, [event, ...]], ["BlockStored", block_hashes, parent_block_hash, token_ids,
//     block_size, lora_id, medium, lora_name], ["BlockRemoved", block_hashes, medium],
//     ["AllBlocksCleared"]
//   kArrayBatchOfMaps (the releases between: an array_like batch [ts, [event, ...], 0] of
//     events as maps; what vllm-router 0.1.17's kv_aware subscriber decodes)
//   Fields without a default in vLLM's structs are always written (nil when none: medium
//   names none of vLLM's tiers); those with one (extra_keys, group_idx, ...) are left out, as
//   msgspec's omit_defaults does; decoders ignore what their structs lack. Block hashes are
//   metrale's own (kv_block_hash), not vLLM's: consumers that key blocks by token ids (llm-d)
//   or match removals to stores by hash see the same.
//
// Not implemented: vLLM's replay socket (a ROUTER answering "events since sequence n").
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "serve/kv_events.h"

namespace metrale::kvevents {

enum class KvEventEncoding : uint8_t { kMap, kArray, kArrayBatchOfMaps };
// "map", "array" or "array-batch"; an Error naming the valid ones otherwise.
KvEventEncoding kv_event_encoding_from_name(std::string_view name);

struct KvEventPublisherOptions {
  std::string endpoint = "tcp://*:5557";  // vLLM's default; port 0 picks a free one
  std::string topic;                      // vLLM's default is ""
  size_t max_queue = 100000;              // batches waiting to be sent; past it the oldest go
  KvEventEncoding encoding = KvEventEncoding::kMap;
};

// One batch's payload.
std::string encode_kv_event_batch(double unix_seconds, std::span<const KvCacheEvent> events,
                                  KvEventEncoding encoding = KvEventEncoding::kMap);

class KvEventPublisher {
 public:
  // Binds the socket (an Error naming the endpoint when it cannot) and starts the sender.
  explicit KvEventPublisher(KvEventPublisherOptions options);
  // Sends what is queued (waiting up to a second for slow peers), then closes.
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // From any thread; never blocks: the batch is stamped now and queued.
  void publish(std::vector<KvCacheEvent> events);
  // The endpoint as bound (a wildcard port resolved), e.g. tcp://0.0.0.0:5557.
  const std::string& endpoint() const { return bound_; }
  int64_t batches_sent() const { return sent_.load(); }
  int64_t batches_dropped() const { return dropped_.load(); }

 private:
  void run();

  KvEventPublisherOptions options_;
  void* context_ = nullptr;
  void* socket_ = nullptr;  // used by the sender thread only, once it runs
  std::string bound_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<double, std::vector<KvCacheEvent>>> queue_;  // guarded by mu_
  bool stopping_ = false;                                           // guarded by mu_
  std::atomic<int64_t> sent_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace metrale::kvevents
