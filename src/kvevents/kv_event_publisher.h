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
// The replay socket (vLLM's replay_endpoint), when `replay_endpoint` is set: a ZMQ ROUTER bound
// there; the last `buffer_steps` batches sent (and at most `buffer_max_bytes` of payload) are
// kept. A subscriber that saw a gap in the sequence numbers asks for the batches from sequence
// n: a 2-part request [empty delimiter, n as 8 bytes big-endian] (what a DEALER sends with the
// delimiter written out; a REQ socket adds it itself), and gets, as vLLM's publisher answers,
//   one message [empty, sequence number (8 bytes), payload] per batch kept when it asked whose
//   number is >= n, oldest first, then the end marker [empty, 8 bytes 0xff (-1 signed), empty
//   payload].
// A number already evicted from the buffer is answered from the oldest batch kept, so the
// first number in the reply is above n and the subscriber knows what it lost; one beyond the
// newest gets the end marker alone. A request of another shape gets no reply (vLLM's too),
// and is counted. A REQ socket reads only the first message of such a reply: use a DEALER.
// Unlike vLLM's, a reply follows its reader's pace (a ROUTER would drop what passes its
// high-water mark, the end marker with it): what does not fit is sent on a later wake-up,
// from the buffer as it then is (a batch evicted meanwhile is skipped: a gap the reader sees).
// At most kMaxPendingReplays replies are under way; one whose reader takes nothing for
// kReplayStall is dropped.
#include <atomic>
#include <chrono>
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
  std::string endpoint = "tcp://*:5557";       // vLLM's default; port 0 picks a free one
  std::string topic;                           // vLLM's default is ""
  size_t max_queue = 100000;                   // batches waiting to be sent; past it the oldest go
  std::string replay_endpoint;                 // "": no replay socket (vLLM's default)
  size_t buffer_steps = 10000;                 // batches kept for replay (vLLM's default)
  size_t buffer_max_bytes = size_t{64} << 20;  // their payloads' bytes, at most
  KvEventEncoding encoding = KvEventEncoding::kMap;
};

// One batch's payload.
std::string encode_kv_event_batch(double unix_seconds, std::span<const KvCacheEvent> events,
                                  KvEventEncoding encoding = KvEventEncoding::kMap);

class KvEventPublisher {
 public:
  static constexpr size_t kMaxPendingReplays = 64;
  static constexpr std::chrono::seconds kReplayStall{30};

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
  // The replay endpoint as bound; "" without one.
  const std::string& replay_endpoint() const { return replay_bound_; }
  int64_t batches_sent() const { return sent_.load(); }
  int64_t batches_dropped() const { return dropped_.load(); }
  int64_t replays_served() const { return replays_.load(); }
  int64_t replay_requests_refused() const { return refused_.load(); }

 private:
  void run();
  void send_batch(uint64_t seq, double unix_seconds, const std::vector<KvCacheEvent>& events);
  // Takes the replay requests waiting and sends what fits of the replies under way (the
  // sender thread's, between batches).
  void serve_replays();
  // Sends what fits of `r`; true when its end marker went.
  struct Replay;
  bool continue_replay(Replay& r);

  KvEventPublisherOptions options_;
  void* context_ = nullptr;
  void* socket_ = nullptr;  // used by the sender thread only, once it runs
  void* replay_ = nullptr;  // the ROUTER, or null; the sender thread's too
  std::string bound_, replay_bound_;
  // The batches sent, kept for replay (the sender thread's): (sequence number, payload).
  std::deque<std::pair<uint64_t, std::string>> sent_buffer_;
  size_t sent_buffer_bytes_ = 0;
  uint64_t next_seq_ = 0;  // the sender thread's: the number of the next batch
  struct Replay {
    std::string peer;            // the ROUTER's identity of the requester
    uint64_t next = 0, end = 0;  // batches [next, end) still to send; end: next_seq_ then
    std::chrono::steady_clock::time_point progress;  // when it last sent something
  };
  std::vector<Replay> replays_under_way_;  // the sender thread's
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<double, std::vector<KvCacheEvent>>> queue_;  // guarded by mu_
  bool stopping_ = false;                                           // guarded by mu_
  std::atomic<int64_t> sent_{0}, dropped_{0}, replays_{0}, refused_{0};
  std::thread thread_;
};

}  // namespace metrale::kvevents
