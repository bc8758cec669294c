// KV-cache events: the MessagePack writer against the spec's bytes, a batch's payload against
// the bytes msgspec writes for vLLM's structs (array_like, tagged, omit_defaults), the events
// the scheduler's prefix cache records (stores with chained hashes, removals on a flush, the
// clear), and the ZMQ publisher's 3-part messages read by a SUB socket.
#include <gtest/gtest.h>
#include <zmq.h>

#include <set>
#include <thread>

#include "kvevents/kv_event_publisher.h"
#include "kvevents/msgpack_writer.h"
#include "serve/scheduler.h"

namespace metrale::kvevents {
namespace {

using namespace std::chrono_literals;

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

TEST(MsgpackWriter, WritesTheSmallestForms) {
  MsgpackWriter w;
  w.unsigned_integer(5);
  w.unsigned_integer(200);
  w.unsigned_integer(70000);
  w.unsigned_integer(uint64_t{1} << 40);
  w.integer(-1);
  w.integer(-100);
  w.integer(-40000);
  w.nil();
  w.boolean(true);
  w.str("ab");
  w.array(3);
  w.array(20);
  w.float64(1.5);
  EXPECT_EQ(hex(w.bytes()),
            "05"                  // positive fixint
            "ccc8"                // uint8 200
            "ce00011170"          // uint32 70000
            "cf0000010000000000"  // uint64 2^40
            "ff"                  // negative fixint -1
            "d09c"                // int8 -100
            "d2ffff63c0"          // int32 -40000
            "c0c3"                // nil, true
            "a26162"              // fixstr "ab"
            "93"                  // fixarray 3
            "dc0014"              // array16 20
            "cb3ff8000000000000"  // float64 1.5
  );
}

TEST(KvEventBatch, MapsAreVllmsCurrentEncoding) {
  std::vector<KvCacheEvent> events;
  std::get<KvBlockRemoved>(events.emplace_back(std::in_place_type<KvBlockRemoved>)).block_hashes = {
      7};
  events.emplace_back(std::in_place_type<KvAllBlocksCleared>);
  // msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[BlockRemoved([7], medium=None),
  // AllBlocksCleared()], data_parallel_rank=0)) with vllm/distributed/kv_events.py's structs.
  EXPECT_EQ(hex(encode_kv_event_batch(1.5, events)),
            "83"
            "a27473"
            "cb3ff8000000000000"  // {"ts": 1.5,
            "a66576656e7473"
            "92"  //  "events": [
            "83"
            "a474797065"
            "ac426c6f636b52656d6f766564"  //   {"type": "BlockRemoved",
            "ac626c6f636b5f686173686573"
            "9107"  //    "block_hashes": [7],
            "a66d656469756d"
            "c0"  //    "medium": None},
            "81"
            "a474797065"
            "b0416c6c426c6f636b73436c6561726564"  //   {"type": "AllBlocksCleared"}],
            "b2646174615f706172616c6c656c5f72616e6b"
            "00");  //  "data_parallel_rank": 0}
  EXPECT_EQ(kv_event_encoding_from_name("array"), KvEventEncoding::kArray);
  EXPECT_THROW(kv_event_encoding_from_name("json"), Error);
}

TEST(KvEventBatch, ArraysAreEarlierVllmsArrayLikeEncoding) {
  // Built in place: g++ 12 misreads a moved variant temporary as uninitialised.
  std::vector<KvCacheEvent> events;
  auto& stored = std::get<KvBlockStored>(events.emplace_back(std::in_place_type<KvBlockStored>));
  stored.block_hashes = {7, 300};
  stored.token_ids = {1, 2, 3, 4};
  stored.block_size = 2;
  std::get<KvBlockRemoved>(events.emplace_back(std::in_place_type<KvBlockRemoved>)).block_hashes = {
      7};
  events.emplace_back(std::in_place_type<KvAllBlocksCleared>);
  // msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[BlockStored([7, 300], None, [1, 2, 3,
  // 4], 2, None, medium=None, lora_name=None), BlockRemoved([7], medium=None),
  // AllBlocksCleared()])) with vLLM's struct definitions in which medium and lora_name have
  // no default (so they are written).
  EXPECT_EQ(hex(encode_kv_event_batch(1.5, events, KvEventEncoding::kArray)),
            "92cb3ff8000000000000"        // [1.5, [...3 events]]
            "93"                          //
            "98ab426c6f636b53746f726564"  // ["BlockStored",
            "9207cd012c"                  //  [7, 300],
            "c0"                          //  None,
            "9401020304"                  //  [1, 2, 3, 4],
            "02c0c0c0"                    //  2, None, None, None]
            "93ac426c6f636b52656d6f766564"
            "9107"
            "c0"                                      // ["BlockRemoved", [7], None]
            "91b0416c6c426c6f636b73436c6561726564");  // ["AllBlocksCleared"]
  // An adapter's pages carry lora_id and lora_name (medium None between them).
  std::vector<KvCacheEvent> lora;
  auto& adapter = std::get<KvBlockStored>(lora.emplace_back(std::in_place_type<KvBlockStored>));
  adapter.block_hashes = {1};
  adapter.token_ids = {9};
  adapter.block_size = 1;
  adapter.lora_id = 1;
  adapter.lora_name = "s";
  EXPECT_EQ(hex(encode_kv_event_batch(0, lora, KvEventEncoding::kArray)).substr(20),
            "91"
            "98ab426c6f636b53746f726564"
            "9101"
            "c0"
            "9109"
            "01"
            "01"
            "c0"
            "a173");
}

std::unique_ptr<Model> load_demo() {
  LoadOptions o;
  o.n_threads = 2;
  o.kv_tokens = 1024;
  o.max_rows = 64;
  return Model::load("models/demo", o);
}

template <typename F>
bool eventually(F&& ready) {
  for (int i = 0; i < 3000; ++i) {
    if (ready()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

void finish(ServeStream& s) {
  std::vector<ServeEvent> events;
  ASSERT_TRUE(eventually([&] {
    s.next(events, 1ms);
    return !events.empty() && events.back().done;
  }));
}

TEST(KvEvents, ThePrefixCacheReportsStoresWithChainedHashesAndRemovals) {
  std::mutex mu;
  std::vector<KvCacheEvent> got;
  std::unique_ptr<Model> model = load_demo();
  SchedulerOptions so{.max_seqs = 2};
  so.kv_events = [&](std::vector<KvCacheEvent> events) {
    std::lock_guard lock(mu);
    for (auto& e : events) got.push_back(std::move(e));
  };
  Scheduler s(*model, so);
  auto taken = [&] {
    std::lock_guard lock(mu);
    return got;
  };
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i + 1);
  auto request = [&](std::vector<int32_t> p) {
    ServeRequest r;
    r.prompt = std::move(p);
    r.max_tokens = 9;
    r.ignore_eos = true;
    auto stream = s.submit(r);
    finish(*stream);
  };
  request(prompt);
  // 40 prompt + 9 generated tokens: 48 of them hold whole pages of 16 (the last generated
  // token has no K/V yet), stored as the prefill and the finish reach page boundaries, each
  // store hanging under the page before it.
  ASSERT_TRUE(eventually([&] {
    size_t pages = 0;
    for (const KvCacheEvent& e : taken()) pages += std::get<KvBlockStored>(e).block_hashes.size();
    return pages == 3;
  }));
  std::vector<uint64_t> hashes;
  std::vector<int32_t> tokens;
  std::optional<uint64_t> parent;
  for (const KvCacheEvent& e : taken()) {
    const auto& stored = std::get<KvBlockStored>(e);
    EXPECT_EQ(stored.block_size, 16);
    EXPECT_FALSE(stored.lora_id.has_value());
    EXPECT_EQ(stored.parent_block_hash, parent);
    ASSERT_EQ(stored.token_ids.size(), 16 * stored.block_hashes.size());
    for (size_t i = 0; i < stored.block_hashes.size(); ++i) {
      parent = kv_block_hash(parent, std::span(stored.token_ids).subspan(i * 16, 16), "");
      EXPECT_EQ(stored.block_hashes[i], *parent) << i;
      hashes.push_back(*parent);
    }
    tokens.insert(tokens.end(), stored.token_ids.begin(), stored.token_ids.end());
  }
  ASSERT_EQ(tokens.size(), 48u);
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), tokens.begin()));
  const size_t first_events = taken().size();

  // A prompt sharing the first two pages: its new pages hang under the second page's hash.
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 32);
  for (int32_t t = 100; t < 120; ++t) other.push_back(t);
  request(other);
  ASSERT_TRUE(eventually([&] { return taken().size() > first_events; }));
  const KvBlockStored branch = std::get<KvBlockStored>(taken()[first_events]);
  ASSERT_TRUE(branch.parent_block_hash.has_value());
  EXPECT_EQ(*branch.parent_block_hash, hashes[1]);
  EXPECT_EQ(branch.token_ids.front(), 100);

  // A flush gives every page back: removals of exactly the stored hashes, then the clear.
  EXPECT_GT(s.flush_prefix_cache(30s), 0);
  std::vector<KvCacheEvent> all = taken();
  ASSERT_GE(all.size(), 4u);
  EXPECT_TRUE(std::holds_alternative<KvAllBlocksCleared>(all.back()));
  std::multiset<uint64_t> stored_hashes, removed_hashes;
  for (const KvCacheEvent& e : all) {
    if (const auto* st = std::get_if<KvBlockStored>(&e)) {
      stored_hashes.insert(st->block_hashes.begin(), st->block_hashes.end());
    } else if (const auto* rm = std::get_if<KvBlockRemoved>(&e)) {
      removed_hashes.insert(rm->block_hashes.begin(), rm->block_hashes.end());
    }
  }
  EXPECT_EQ(removed_hashes, stored_hashes);
}

TEST(KvEventPublisher, SendsTopicSequenceAndPayload) {
  KvEventPublisher pub({.endpoint = "tcp://127.0.0.1:0", .topic = "kv@test@demo"});
  ASSERT_EQ(pub.endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << pub.endpoint();
  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  ASSERT_EQ(zmq_connect(sub, pub.endpoint().c_str()), 0);
  ASSERT_EQ(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
  const int timeout_ms = 50;
  zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  std::vector<KvCacheEvent> batch;
  batch.emplace_back(std::in_place_type<KvAllBlocksCleared>);
  // A SUB socket sees only what is sent after its subscription arrives: publish until one
  // comes through (bounded).
  std::vector<std::string> parts;
  for (int i = 0; i < 200 && parts.empty(); ++i) {
    pub.publish(batch);
    for (;;) {
      std::string part(4096, '\0');
      const int n = zmq_recv(sub, part.data(), part.size(), 0);
      if (n < 0) break;
      part.resize(static_cast<size_t>(n));
      parts.push_back(part);
      int more = 0;
      size_t len = sizeof more;
      zmq_getsockopt(sub, ZMQ_RCVMORE, &more, &len);
      if (!more) break;
    }
  }
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], "kv@test@demo");
  ASSERT_EQ(parts[1].size(), 8u);  // big-endian sequence number
  EXPECT_EQ(parts[1].substr(0, 6), std::string(6, '\0'));
  // {"ts": ..., "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 0}.
  ASSERT_EQ(parts[2].size(), 13u + 51u) << hex(parts[2]);
  EXPECT_EQ(hex(parts[2].substr(0, 5)), "83a27473cb");
  EXPECT_EQ(hex(parts[2].substr(13)),
            "a66576656e7473"
            "91"
            "81a474797065b0416c6c426c6f636b73436c6561726564"
            "b2646174615f706172616c6c656c5f72616e6b00");
  zmq_close(sub);
  zmq_ctx_term(ctx);
  EXPECT_GE(pub.batches_sent(), 1);
}

// One message's parts from `socket` (waiting up to 5 s: a hang guard); none on the timeout.
std::vector<std::string> receive_parts(void* socket) {
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, 5000) <= 0) return {};
  std::vector<std::string> parts;
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, 0) < 0) break;
    parts.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
    if (!more) break;
  }
  return parts;
}

uint64_t from_big_endian(const std::string& bytes) {
  uint64_t x = 0;
  for (char c : bytes) x = x << 8 | static_cast<unsigned char>(c);
  return x;
}

// A replay from a DEALER: [empty, 8-byte start] out; the sequence numbers that come back
// (each [empty, number, payload], the payload checked non-empty) until the end marker.
std::vector<uint64_t> replay_from(void* dealer, uint64_t start) {
  std::string number(8, '\0');
  for (int i = 0; i < 8; ++i)
    number[static_cast<size_t>(i)] = static_cast<char>(start >> (56 - 8 * i));
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, number.data(), number.size(), 0);
  std::vector<uint64_t> seqs;
  for (;;) {
    const std::vector<std::string> parts = receive_parts(dealer);
    if (parts.size() != 3 || !parts[0].empty()) {
      ADD_FAILURE() << "from " << start << ": a reply of " << parts.size()
                    << " parts (expected 3) after " << seqs.size();
      return seqs;
    }
    if (parts[1] == std::string(8, '\xff')) {
      EXPECT_TRUE(parts[2].empty());
      return seqs;
    }
    EXPECT_FALSE(parts[2].empty());
    seqs.push_back(from_big_endian(parts[1]));
  }
}

TEST(KvEventPublisher, ReplaysTheBatchesKeptFromASequenceNumberThenTheEndMarker) {
  KvEventPublisher pub(
      {.endpoint = "tcp://127.0.0.1:0", .replay_endpoint = "tcp://127.0.0.1:0", .buffer_steps = 4});
  ASSERT_EQ(pub.replay_endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << pub.replay_endpoint();
  std::vector<KvCacheEvent> batch;
  batch.emplace_back(std::in_place_type<KvAllBlocksCleared>);
  for (int i = 0; i < 6; ++i) pub.publish(batch);
  for (int i = 0; i < 5000 && pub.batches_sent() < 6; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(pub.batches_sent(), 6);
  void* ctx = zmq_ctx_new();
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(dealer, pub.replay_endpoint().c_str()), 0);
  // Sent 0..5, kept the last 4.
  EXPECT_EQ(replay_from(dealer, 3), (std::vector<uint64_t>{3, 4, 5}));
  // 0 and 1 were evicted: the reply starts at the oldest kept, as vLLM's does.
  EXPECT_EQ(replay_from(dealer, 0), (std::vector<uint64_t>{2, 3, 4, 5}));
  // Whole replays one after another all arrive (the ROUTER's high-water mark leaves room).
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(replay_from(dealer, 2), (std::vector<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(replay_from(dealer, 6), std::vector<uint64_t>{});
  EXPECT_EQ(replay_from(dealer, ~uint64_t{0}), std::vector<uint64_t>{});
  // A request without the empty delimiter gets no reply: the next reply is the next request's.
  const std::string five("\0\0\0\0\0\0\0\5", 8);
  zmq_send(dealer, five.data(), five.size(), 0);
  EXPECT_EQ(replay_from(dealer, 4), (std::vector<uint64_t>{4, 5}));
  EXPECT_EQ(pub.replays_served(), 15);
  EXPECT_EQ(pub.replay_requests_refused(), 1);
  zmq_close(dealer);
  zmq_ctx_term(ctx);
}

TEST(KvEventPublisher, AReplayLongerThanTheHighWaterMarkFollowsItsReadersPace) {
  KvEventPublisher pub({.endpoint = "tcp://127.0.0.1:0",
                        .replay_endpoint = "tcp://127.0.0.1:0",
                        .buffer_steps = 2500});
  std::vector<KvCacheEvent> batch;
  batch.emplace_back(std::in_place_type<KvAllBlocksCleared>);
  for (int i = 0; i < 2500; ++i) pub.publish(batch);
  for (int i = 0; i < 5000 && pub.batches_sent() < 2500; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(pub.batches_sent(), 2500);
  void* ctx = zmq_ctx_new();
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(dealer, pub.replay_endpoint().c_str()), 0);
  // Twice: the second request finds the ROUTER's pipe already used by the first reply.
  for (int round = 0; round < 2; ++round) {
    const std::string zero(8, '\0');
    zmq_send(dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(dealer, zero.data(), zero.size(), 0);
    // Not read for a while: the reply fills the pipe (1000 messages) and waits for the rest.
    std::this_thread::sleep_for(100ms);
    std::vector<uint64_t> seqs;
    for (;;) {
      const std::vector<std::string> parts = receive_parts(dealer);
      ASSERT_EQ(parts.size(), 3u) << "after " << seqs.size();
      if (parts[1] == std::string(8, '\xff')) break;
      seqs.push_back(from_big_endian(parts[1]));
    }
    ASSERT_EQ(seqs.size(), 2500u);
    for (size_t i = 0; i < seqs.size(); ++i) ASSERT_EQ(seqs[i], i);
  }
  zmq_close(dealer);
  zmq_ctx_term(ctx);
}

TEST(KvEventPublisher, ABadReplayEndpointIsAnErrorNamingIt) {
  try {
    KvEventPublisher pub({.endpoint = "tcp://127.0.0.1:0", .replay_endpoint = "nonsense://y"});
    FAIL() << "bound a nonsense replay endpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-events-replay-endpoint nonsense://y"),
              std::string::npos)
        << e.what();
  }
}

TEST(KvEventPublisher, ABadEndpointIsAnErrorNamingIt) {
  try {
    KvEventPublisher pub({.endpoint = "nonsense://x"});
    FAIL() << "bound a nonsense endpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nonsense://x"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace metrale::kvevents
